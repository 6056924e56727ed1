"""The capture model server: prefix routing, capture middleware and upstream proxy.

Run it with ``ngcapture serve`` or ``uvicorn --factory capture_core.server:create_app`` (with
``NGCAPTURE_*`` variables set). Importing this package imports starlette and httpx;
``import capture_core`` does not.
"""

from capture_core.server.app import CaptureApp, create_app
from capture_core.server.counters import CaptureCounters
from capture_core.server.middleware import WARNING_HEADER, CaptureMiddleware
from capture_core.server.proxy import UpstreamProxy
from capture_core.server.routing import RolloutRoute, route_path
from capture_core.server.settings import CaptureSettings, benchmark_capture_settings

__all__ = [
    "WARNING_HEADER",
    "CaptureApp",
    "CaptureCounters",
    "CaptureMiddleware",
    "CaptureSettings",
    "RolloutRoute",
    "UpstreamProxy",
    "benchmark_capture_settings",
    "create_app",
    "route_path",
]
