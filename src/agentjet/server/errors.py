"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``. Never a bare 500.

The domain raises these; ``http/errors.py`` turns them (and the web framework's own errors) into responses."""

from __future__ import annotations


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, "authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> APIError:
    return APIError(403, message, "permission_error", code="forbidden")


def not_found(message: str) -> APIError:
    return APIError(404, message, "not_found_error", code="not_found")


def conflict(message: str, code: str) -> APIError:
    return APIError(409, message, "conflict_error", code=code)


def unavailable(message: str, code: str, retry_after_s: float | None = None) -> APIError:
    headers = {"Retry-After": f"{retry_after_s:.0f}"} if retry_after_s is not None else None
    return APIError(503, message, "service_unavailable", code=code, headers=headers)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
