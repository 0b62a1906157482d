#!/usr/bin/python3
"""Asks the test kit's token endpoint (scripts/oauth_endpoint.py) whether a token is good for a
mailbox: reads "USER\\0TOKEN" on standard input, exits 0 (good), 1 (refused, the reason on
standard error) or 2 (the endpoint cannot be reached). Dovecot's Lua passdb
(scripts/oauth_check.lua) runs it for each XOAUTH2 or OAUTHBEARER login.

Why not `passdb oauth2`: Dovecot 2.3 sends its introspection URL the token alone, never the
login user, so it cannot check an app-only token's right to one mailbox (Microsoft's model, in
which Exchange checks the app's mailbox permission). Why not checkpassword: its protocol stops at
512 bytes of user and password, and a real token is 1.5-2.5 KB.
"""
import json
import os
import sys
import urllib.error
import urllib.request

URL = os.environ.get("WH_OAUTH_CHECK_URL", "http://127.0.0.1:10180/check")


def main():
    data = sys.stdin.buffer.read(65536)
    user, _, token = data.partition(b"\0")
    body = json.dumps({"user": user.decode(errors="replace"), "token": token.decode(errors="replace")})
    request = urllib.request.Request(URL, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10):
            return 0
    except urllib.error.HTTPError as e:
        sys.stderr.write("oauth check for %s: %s\n" % (user.decode(errors="replace"), e.read().decode(errors="replace")))
        return 1
    except OSError as e:
        sys.stderr.write("oauth check: the token endpoint cannot be reached: %s\n" % e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
