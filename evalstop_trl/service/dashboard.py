"""The dashboard: a static single-page app served at ``/`` of ``evalstop serve``.

Everything it shows comes from the authenticated ``/v1`` API (the token lives in the browser's
session storage and travels only as the bearer header); the files here are public and static, so
these routes need no auth. The HTML, JavaScript and CSS ship inside the package (no CDN, no build
step) and are served with a strict Content-Security-Policy: scripts and styles from this origin
only, no inline script, no framing.

Example::

    app = create_app(coordinator)
    mount_dashboard(app)   # GET / and /dashboard/*
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

__all__ = ["CONTENT_SECURITY_POLICY", "STATIC_DIR", "mount_dashboard"]

STATIC_DIR = Path(__file__).with_name("static")

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate (ETag): an upgraded server never runs a stale page
}
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}


class _StaticFiles(StaticFiles):
    """StaticFiles with the dashboard's security headers and explicit types (the host's
    ``mimetypes`` table may not know ``.js``; a module script needs a JavaScript type)."""

    async def get_response(self, path: str, scope: Scope):
        response = await super().get_response(path, scope)
        response.headers.update(_HEADERS)
        media = _TYPES.get(Path(path).suffix)
        if media and response.status_code in (200, 304):
            response.headers["Content-Type"] = media
        return response


def mount_dashboard(app: FastAPI, prefix: str = "/dashboard") -> None:
    """Serve the dashboard: ``GET /`` (the page) and ``prefix/*`` (its scripts and styles).

    Neither appears in the OpenAPI schema."""
    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard_index() -> FileResponse:
        return FileResponse(index, media_type="text/html; charset=utf-8", headers=_HEADERS)

    app.mount(prefix, _StaticFiles(directory=STATIC_DIR), name="dashboard")
