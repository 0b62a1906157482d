"""SMTP sink for the worker host's tests: aiosmtpd handler delivering into Maildirs.

Run it with (scripts/services.sh does this for you, as the unprivileged `wh` user):

    PYTHONPATH=scripts python3 -m aiosmtpd -n -l 127.0.0.1:2525 -c smtp_sink.Handler

Delivery
    Every accepted recipient <localpart>@<any domain> gets the message in
    <mail dir>/<localpart>/Maildir (local part lower-cased), which is exactly where the
    Dovecot of scripts/services.sh looks for user <localpart>, so a test can send to
    alice@localhost and read it back over IMAP as alice/secret. Return-Path and
    Delivered-To headers carrying the envelope are prepended.

Failures a test can choose
    * local part starting with `fail4xx` -> RCPT gets `451 4.3.0 try later`
    * local part starting with `fail5xx` -> RCPT gets `550 5.1.1 no such user`
    * runtime switch: while a file <services dir>/smtp-fail/<address> exists
      (e.g. .services/smtp-fail/bob@localhost), its first line is the reply given
      to RCPT for that address, for example `451 4.3.0 try later` or
      `550 5.1.1 no such user` (an empty file means `451 4.3.0 try later`).
      Delete the file and the address is accepted again. A `2xx` first line accepts
      the address even where its local part would fail (`fail5xx-demo` fixed, as
      `scripts/demo-mail.sh --fix` does). The file name is matched against the
      address as given, then lower-cased, then the bare local part. The file is
      read on every RCPT, so the switch takes effect immediately.
    * late answer: while a file <services dir>/smtp-delay/<address> exists, a mail
      to that address is delivered at once but the answer to its end of DATA comes
      only after the number of seconds the file's first line holds (e.g. `6`), so
      that a client can time out after the final "." while the mail went out.
      Matched like the failure switch.

Answers
    The end of DATA is answered `250 OK delivered to <rcpt>[, <rcpt>...]`, so that
    a client's record of the answer shows which mail it belongs to.

Paths (environment)
    WH_SERVICES_DIR    services dir (default: <repo>/.services, the parent of scripts/)
    WH_MAIL_DIR        mail root (default: $WH_SERVICES_DIR/mail)
    WH_SMTP_FAIL_DIR   switch folder (default: $WH_SERVICES_DIR/smtp-fail)
    WH_SMTP_DELAY_DIR  late-answer folder (default: $WH_SERVICES_DIR/smtp-delay)
"""

import asyncio
import logging
import mailbox
import os
import re

_HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES_DIR = os.environ.get("WH_SERVICES_DIR") or os.path.join(os.path.dirname(_HERE), ".services")
MAIL_DIR = os.environ.get("WH_MAIL_DIR") or os.path.join(SERVICES_DIR, "mail")
FAIL_DIR = os.environ.get("WH_SMTP_FAIL_DIR") or os.path.join(SERVICES_DIR, "smtp-fail")
DELAY_DIR = os.environ.get("WH_SMTP_DELAY_DIR") or os.path.join(SERVICES_DIR, "smtp-delay")

DEFAULT_SWITCH_REPLY = "451 4.3.0 try later"
_SAFE_LOCAL = re.compile(r"^[a-z0-9!#$%&'*+=?^_`{|}~-][a-z0-9.!#$%&'*+=?^_`{|}~-]*$")
_REPLY = re.compile(r"^[245][0-9][0-9]( .*)?$")

log = logging.getLogger("smtp_sink")
if not logging.getLogger().handlers:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def split_address(address):
    """Return (local part, domain) of an envelope address, local part lower-cased."""
    address = address.strip().strip("<>")
    local, _, domain = address.rpartition("@")
    if not local:  # no '@' at all
        local, domain = domain, ""
    return local.lower(), domain.lower()


def switch_line(folder, address):
    """The first line of the switch file in `folder` for this address, or None."""
    address = address.strip().strip("<>")
    local, _ = split_address(address)
    for name in dict.fromkeys((address, address.lower(), local)):
        if not name or "/" in name or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.readline().strip()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        except OSError as e:
            log.warning("cannot read switch %s: %s", path, e)
            continue
    return None


def answer_delay(address):
    """Seconds to hold back the end-of-DATA answer for this address (0: none)."""
    line = switch_line(DELAY_DIR, address)
    if not line:
        return 0.0
    try:
        return max(0.0, float(line.split()[0]))
    except ValueError:
        log.warning("delay switch for %s: %r is not a number of seconds", address, line)
        return 0.0


def switch_reply(address):
    """The reply configured by a file in FAIL_DIR for this address, or None."""
    line = switch_line(FAIL_DIR, address)
    if line is None:
        return None
    if not line:
        return DEFAULT_SWITCH_REPLY
    if not _REPLY.match(line):
        log.warning("switch for %s: %r is not an SMTP reply, using %r", address, line, DEFAULT_SWITCH_REPLY)
        return DEFAULT_SWITCH_REPLY
    return line


def deliver(local, content):
    """Add one message (bytes) to <MAIL_DIR>/<local>/Maildir."""
    home = os.path.join(MAIL_DIR, local)
    os.makedirs(home, exist_ok=True)
    box = mailbox.Maildir(os.path.join(home, "Maildir"), factory=None, create=True)
    return box.add(content)


class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local, _ = split_address(address)
        reply = switch_reply(address)
        if reply is not None and not reply.startswith("2"):
            return reply
        fixed = reply is not None
        if local.startswith("fail4xx") and not fixed:
            return "451 4.3.0 try later"
        if local.startswith("fail5xx") and not fixed:
            return "550 5.1.1 no such user"
        if not _SAFE_LOCAL.match(local) or ".." in local:
            return "553 5.1.3 unusable local part"
        envelope.rcpt_tos.append(address)
        return reply or "250 OK"

    async def handle_DATA(self, server, session, envelope):
        content = envelope.original_content or envelope.content
        if isinstance(content, str):
            content = content.encode("utf-8", "surrogateescape")
        # Maildir files conventionally use LF line endings; Dovecot adds CR on output.
        body = content.replace(b"\r\n", b"\n")
        sender = envelope.mail_from or ""
        for rcpt in envelope.rcpt_tos:
            local, _ = split_address(rcpt)
            headers = "Return-Path: <%s>\nDelivered-To: %s\n" % (sender, rcpt.strip("<>"))
            try:
                key = deliver(local, headers.encode("utf-8", "surrogateescape") + body)
            except OSError as e:
                log.error("delivery to %s failed: %s", rcpt, e)
                return "451 4.3.0 local delivery failed"
            log.info("delivered from <%s> to <%s> as %s", sender, rcpt, key)
        delay = max((answer_delay(rcpt) for rcpt in envelope.rcpt_tos), default=0.0)
        if delay > 0:
            log.info("holding the answer for %.1f s", delay)
            await asyncio.sleep(delay)
        return "250 OK delivered to " + ", ".join(r.strip("<>") for r in envelope.rcpt_tos)
