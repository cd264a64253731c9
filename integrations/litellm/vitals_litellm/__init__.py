"""vitals for LiteLLM: report every call attempt to vitals and route by its health.

Two lines of configuration. In the proxy's config.yaml:

    litellm_settings:
      callbacks: vitals_litellm.callback

In Python:

    import litellm, vitals_litellm
    litellm.callbacks = [vitals_litellm.callback]

`callback` is built on first access from the `VITALS_*` environment (see `Settings`); build your
own `VitalsCallback(kafka_brokers=..., routing=...)` to set it in code.
"""

from .plugin import ROUTING_MODES, Settings, VitalsCallback, endpoint_name
from .outcome import Outcome, classify
from .reporter import Report, Reporter, escape_name
from .view import Follower, HealthView

__all__ = [
    "ROUTING_MODES", "Settings", "VitalsCallback", "endpoint_name", "Outcome", "classify", "Report",
    "Reporter", "escape_name", "Follower", "HealthView", "callback",
]
__version__ = "0.1.0"

_callback = None


def __getattr__(name):
    # The shared instance is made on first use, from the environment (PEP 562).
    global _callback
    if name == "callback":
        if _callback is None:
            _callback = VitalsCallback()
        return _callback
    raise AttributeError(f"module 'vitals_litellm' has no attribute {name!r}")
