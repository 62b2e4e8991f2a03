"""Where requests go: the target protocol and every kind of target behind one factory.

`factory.make_target` is the one place a scenario's `target:` becomes an object: the HTTP
target for OpenAI-compatible servers and the vLLM/SGLang/TGI engines (`openai`, `engines`,
`http/` for the transport, SSE and wire dialects), the bundled reference server (`reference`),
the virtual-time simulator (`sim`) and the scripted test target (`mock`). Engine set-up before
t0 (served model, version, prompt calibration) lives here too. Imports `workload` and `plan`;
`run` and everything above may import it.
"""

from fairbench.targets.base import Done, Failed, Started, Target, Token
from fairbench.targets.factory import make_target, metrics_url

__all__ = ["Done", "Failed", "Started", "Target", "Token", "make_target", "metrics_url"]
