#!/usr/bin/env python3
"""A token endpoint standing in for Microsoft's and Google's, for the tests (scripts/services.sh
starts it on 127.0.0.1:10180). State lives in memory; each test registers a client of its own.

Token requests (RFC 6749, form-encoded, the client authenticated in the body or with Basic):
  POST /token  grant_type=client_credentials                       app-only: any of its mailboxes
               grant_type=refresh_token&refresh_token=R             acts for R's user
               grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=JWT
                                                                    RS256, iss = client_id,
                                                                    aud = this /token, sub = user
  200 {"access_token", "token_type": "Bearer", "expires_in"}; errors as RFC 6749 §5.2:
  401 invalid_client, 400 invalid_grant | unauthorized_client | unsupported_grant_type | invalid_scope.

For the mail servers:
  POST /introspect token=T       RFC 7662, as Dovecot's passdb oauth2 asks (introspection_mode
               post): {"active", "username", "client_id", "exp", "scope", "wh_mailboxes"}, the
               last a regular expression of the mailboxes the token may open: the user it acts
               for, or its client's mailboxes for an app-only token. Dovecot sends the token
               alone, so it matches the login user against that itself (scripts/services.sh).
  POST /check {"token", "user"}  200 when the token is good for that mailbox, else 403 with why
               (for a client that knows the user, and for people trying things by hand).

For the tests:
  POST /admin/clients {"client_id", "client_secret", "public_key", "mailboxes", "lifetime",
                       "token_length", "scope"}
  POST /admin/refresh_tokens {"client_id", "refresh_token", "user"}
  POST /admin/revoke {"client_id"} | {"token"}
  POST /admin/fail {"client_id", "status", "count", "retry_after"}
  GET  /admin/stats?client_id=X  {"token_requests", "issued", "refused", "introspections"}
"""
import base64
import json
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

HOST = os.environ.get("WH_OAUTH_HOST", "127.0.0.1")
PORT = int(os.environ.get("WH_OAUTH_PORT", "10180"))
TOKEN_URL = "http://%s:%d/token" % (HOST, PORT)
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

lock = threading.Lock()
clients = {}         # client_id -> dict
refresh_tokens = {}  # refresh token -> (client_id, user)
tokens = {}          # access token -> {"client_id", "user" (None: app-only), "expires", "revoked", "scope"}
stats = {}           # client_id -> counts
failures = {}        # client_id -> [status, count, retry_after]


def count(client_id, key):
    stats.setdefault(client_id, {"token_requests": 0, "issued": 0, "refused": 0, "introspections": 0})
    stats[client_id][key] += 1


def local_part(user):
    return (user or "").split("@", 1)[0].lower()


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Refusal(Exception):
    def __init__(self, status, error, description):
        super().__init__(description)
        self.status, self.error, self.description = status, error, description


def authenticate_client(form, headers):
    client_id, secret = form.get("client_id"), form.get("client_secret")
    auth = headers.get("Authorization", "")
    if auth.startswith("Basic "):
        try:
            client_id, secret = base64.b64decode(auth[6:]).decode().split(":", 1)
        except Exception:
            raise Refusal(401, "invalid_client", "the Basic credentials cannot be read")
    client = clients.get(client_id or "")
    if client is None:
        raise Refusal(401, "invalid_client", "no client %r is registered" % client_id)
    return client_id, client, secret


def check_scope(client, form):
    wanted = client.get("scope")
    if wanted and wanted not in (form.get("scope") or "").split():
        raise Refusal(400, "invalid_scope", "the scope must include %s" % wanted)


def verify_assertion(assertion):
    try:
        head, body, signature = assertion.split(".")
        header = json.loads(b64url_decode(head))
        claims = json.loads(b64url_decode(body))
    except Exception:
        raise Refusal(400, "invalid_grant", "the assertion is not a JWT")
    client = clients.get(claims.get("iss", ""))
    if client is None or not client.get("public_key"):
        raise Refusal(400, "invalid_grant", "no service account %r" % claims.get("iss"))
    if header.get("alg") != "RS256":
        raise Refusal(400, "invalid_grant", "the assertion is not RS256")
    key = serialization.load_pem_public_key(client["public_key"].encode())
    try:
        key.verify(b64url_decode(signature), (head + "." + body).encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise Refusal(400, "invalid_grant", "Invalid JWT Signature.")
    now = time.time()
    if claims.get("aud") != TOKEN_URL:
        raise Refusal(400, "invalid_grant", "the audience must be %s" % TOKEN_URL)
    if not (claims.get("iat", 0) - 300 <= now < claims.get("exp", 0)) or claims["exp"] - claims["iat"] > 3600:
        raise Refusal(400, "invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
    return claims["iss"], client, claims


def grant(form, headers):
    """(client_id, user or None) for a token request, or a Refusal."""
    kind = form.get("grant_type")
    if kind == JWT_BEARER:
        client_id, client, claims = verify_assertion(form.get("assertion", ""))
        count(client_id, "token_requests")
        fail_if_asked(client_id)
        user = claims.get("sub") or ""
        if not may_act_for(client, user):
            raise Refusal(400, "invalid_grant", "Invalid email or User ID: %s is not delegated" % user)
        wanted = client.get("scope")
        if wanted and wanted not in (claims.get("scope") or "").split():
            raise Refusal(400, "unauthorized_client", "Client is unauthorized to retrieve access tokens using this method, or client not authorized for any of the scopes requested.")
        return client_id, local_part(user)
    client_id, client, secret = authenticate_client(form, headers)
    count(client_id, "token_requests")
    fail_if_asked(client_id)
    if kind == "client_credentials":
        if not client.get("client_secret"):
            raise Refusal(400, "unauthorized_client", "the client has no secret: it may not use client_credentials")
        if secret != client["client_secret"]:
            raise Refusal(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        check_scope(client, form)
        return client_id, None
    if kind == "refresh_token":
        if client.get("client_secret") and secret != client["client_secret"]:
            raise Refusal(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        owner = refresh_tokens.get(form.get("refresh_token", ""))
        if owner is None or owner[0] != client_id:
            raise Refusal(400, "invalid_grant", "Token has been expired or revoked.")
        check_scope(client, form)
        return client_id, local_part(owner[1])
    raise Refusal(400, "unsupported_grant_type", "grant_type %r is not supported" % kind)


def may_act_for(client, user):
    mailboxes = [local_part(m) for m in client.get("mailboxes", ["*"])]
    return "*" in mailboxes or local_part(user) in mailboxes


def fail_if_asked(client_id):
    failure = failures.get(client_id)
    if failure and failure[1] > 0:
        failure[1] -= 1
        raise Failing(failure[0], failure[2])


class Failing(Exception):
    def __init__(self, status, retry_after):
        super().__init__("failing on purpose")
        self.status, self.retry_after = status, retry_after


def mailbox_pattern(entry):
    """The mailboxes a token may open, as the POSIX regular expression Dovecot's passdb
    matches the login user against (`pass_attrs` in scripts/services.sh): the user a token acts
    for, or an app-only token's client's mailboxes."""
    if entry["user"] is not None:
        names = [entry["user"]]
    else:
        names = [local_part(m) for m in clients.get(entry["client_id"], {}).get("mailboxes", ["*"])]
    if "*" in names:
        return "^.*$"
    return "^(%s)$" % "|".join("".join("\\" + c if c in ".[]{}()\\*+?^$|" else c for c in n) for n in names)


def token_status(token, user):
    """None when `token` is good for `user`, else why not."""
    entry = tokens.get(token)
    if entry is None:
        return "unknown token"
    if entry["revoked"]:
        return "revoked"
    if time.time() >= entry["expires"]:
        return "expired"
    if entry["user"] is None:
        if not may_act_for(clients.get(entry["client_id"], {}), user):
            return "the app has no permission on mailbox %s" % local_part(user)
        return None
    if entry["user"] != local_part(user):
        return "the token acts for %s, not %s" % (entry["user"], local_part(user))
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def answer(self, status, body, content_type="application/json", extra=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def form(self):
        return {k: v[0] for k, v in parse_qs(self.body().decode(), keep_blank_values=True).items()}

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/admin/stats":
            client_id = parse_qs(url.query).get("client_id", [""])[0]
            with lock:
                zero = {"token_requests": 0, "issued": 0, "refused": 0, "introspections": 0}
                return self.answer(200, stats.get(client_id, zero))
        if url.path == "/health":
            return self.answer(200, {"ok": True})
        self.answer(404, {"error": "not_found"})

    def do_POST(self):
        path = urlparse(self.path).path
        try:
            if path == "/token":
                return self.token()
            if path == "/check":
                return self.check()
            if path == "/introspect":
                return self.introspect()
            if path.startswith("/admin/"):
                return self.admin(path[len("/admin/"):], json.loads(self.body() or b"{}"))
        except (ValueError, KeyError) as e:
            return self.answer(400, {"error": "invalid_request", "error_description": str(e)})
        self.answer(404, {"error": "not_found"})

    def token(self):
        form = self.form()
        with lock:
            try:
                client_id, user = grant(form, self.headers)
            except Failing as f:
                extra = [("Retry-After", str(f.retry_after))] if f.retry_after else []
                return self.answer(f.status, b"the token service is busy, try later\n", "text/plain", extra)
            except Refusal as r:
                if r.error != "invalid_client" or clients.get(form.get("client_id", "")):
                    count(form.get("client_id") or "", "refused")
                return self.answer(r.status, {"error": r.error, "error_description": r.description})
            client = clients[client_id]
            length = client.get("token_length", 2000)
            token = "".join(secrets.choice(ALPHABET) for _ in range(length))
            lifetime = client.get("lifetime", 3600)
            tokens[token] = {"client_id": client_id, "user": user, "expires": time.time() + lifetime,
                             "revoked": False, "scope": form.get("scope", "")}
            count(client_id, "issued")
        self.answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": lifetime})

    def check(self):
        request = json.loads(self.body() or b"{}")
        with lock:
            entry = tokens.get(request.get("token", ""))
            if entry:
                count(entry["client_id"], "introspections")
            why = token_status(request.get("token", ""), request.get("user", ""))
        if why is None:
            return self.answer(200, {"ok": True})
        self.answer(403, {"ok": False, "error": why})

    def introspect(self):
        token = self.form().get("token", "")
        with lock:
            entry = tokens.get(token)
            if entry is None:
                return self.answer(200, {"active": False, "username": ""})
            count(entry["client_id"], "introspections")
            if entry["revoked"] or time.time() >= entry["expires"]:
                return self.answer(200, {"active": False, "username": entry["user"] or entry["client_id"]})
            return self.answer(200, {"active": True, "client_id": entry["client_id"],
                                     "username": entry["user"] or entry["client_id"],
                                     "exp": int(entry["expires"]), "scope": entry["scope"],
                                     "wh_mailboxes": mailbox_pattern(entry)})

    def admin(self, what, request):
        with lock:
            if what == "clients":
                clients[request["client_id"]] = {
                    "client_secret": request.get("client_secret"),
                    "public_key": request.get("public_key"),
                    "mailboxes": request.get("mailboxes") or ["*"],
                    "lifetime": int(request.get("lifetime") or 3600),
                    "token_length": int(request.get("token_length") or 2000),
                    "scope": request.get("scope"),
                }
            elif what == "refresh_tokens":
                refresh_tokens[request["refresh_token"]] = (request["client_id"], request["user"])
            elif what == "revoke":
                for token, entry in tokens.items():
                    if token == request.get("token") or entry["client_id"] == request.get("client_id"):
                        entry["revoked"] = True
            elif what == "fail":
                failures[request["client_id"]] = [int(request["status"]), int(request.get("count") or 1),
                                                  request.get("retry_after")]
            else:
                return self.answer(404, {"error": "not_found"})
        self.answer(201, {"ok": True})


def sweep():
    """Forget tokens an hour past their expiry, so that a long run's memory stays flat."""
    while True:
        time.sleep(60)
        with lock:
            now = time.time()
            for token in [t for t, e in tokens.items() if e["expires"] < now - 3600]:
                del tokens[token]


if __name__ == "__main__":
    threading.Thread(target=sweep, daemon=True).start()
    server = ThreadingHTTPServer((HOST, PORT), Handler)
    server.daemon_threads = True
    print("oauth endpoint on %s" % TOKEN_URL, flush=True)
    server.serve_forever()
