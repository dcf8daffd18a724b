"""The pages anyone may reach: the health checks, the login form, and logging in and out."""

from __future__ import annotations

from aiohttp import web

from pipeline.http.console._auth import Sessions
from pipeline.http.console._page import Views, local_path, session_of

__all__ = ["LoginViews"]


class LoginViews(Views):
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.health)
        app.router.add_get("/favicon.ico", self.no_icon)
        app.router.add_get("/login", self.login_page)
        app.router.add_post("/login", self.login)
        app.router.add_post("/logout", self.logout)

    async def health(self, request: web.Request) -> web.Response:
        """Up, and ready: the console serves only once it read the config topic."""
        return web.json_response({"status": "ok"})

    async def no_icon(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def login_page(self, request: web.Request) -> web.Response:
        return self._login_form(request, error=None)

    def _login_form(
        self, request: web.Request, error: str | None, next_page: str | None = None
    ) -> web.Response:
        # A page open in another tab (or the browser's own favicon fetch) may have set the token
        # already: keep it, so that every login form this browser shows stays valid.
        token = Sessions.login_token_of(request) or Sessions.new_login_token()
        response = self._page(
            request,
            "login.html",
            status=401 if error else 200,
            next=next_page or request.query.get("next", "/"),
            error=error,
            login_token=token,
        )
        self.sessions.set_login_cookie(response, token)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        target = local_path(str(form.get("next", "/")), "/")
        if not self.sessions.login_token_ok(request, str(form.get("login_token", ""))):
            return self._login_form(request, "the login form expired: try again", target)
        if not self.sessions.check_password(str(form.get("password", ""))):
            await self.sessions.wrong_password()
            return self._login_form(request, "wrong password", target)
        response = web.HTTPSeeOther(target)
        self.sessions.start(response)
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("/login")
        self.sessions.end(session_of(request), response)
        raise response
