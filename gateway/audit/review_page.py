"""The auditors' review page (`/audit/ui`): static HTML and a small script that read the
JSON audit API with the key the auditor pastes. The page itself needs no key: it holds no
data, and every API call it makes is authorised like any other."""

from __future__ import annotations

from pathlib import Path

from litestar import Response, Router, get
from litestar.params import FromPath

from gateway.http.errors import not_found

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE = "audit-review.html"
ASSET_TYPES = {
    "audit-review.js": "text/javascript; charset=utf-8",
    "audit-review.css": "text/css; charset=utf-8",
}
# Same-origin script, styles and API calls only; audit records are shown as text.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _asset(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


@get("/", include_in_schema=False)
async def review_page() -> Response[bytes]:
    return Response(_asset(PAGE), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@get("/{name:str}", include_in_schema=False)
async def review_asset(name: FromPath[str]) -> Response[bytes]:
    media_type = ASSET_TYPES.get(name)
    if media_type is None:
        raise not_found(f"No asset {name!r}.")
    return Response(_asset(name), media_type=media_type, headers=SECURITY_HEADERS)


# No key: the page holds no data, and every API call it makes is authorised like any other.
REVIEW_PAGE_ROUTER = Router(path="/audit/ui", route_handlers=[review_page, review_asset])
