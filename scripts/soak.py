"""The soak run behind scripts/soak.sh: one release host under steady load for N minutes,
sampled every interval, judged at the end. Python's standard library only (imaplib, urllib),
psql for the database and gnuplot for the chart, so that nothing needs installing but those.

What it drives (docs/SCALING.md, "An hour of steady load"):
  * pings through the real inbound path: APPENDed straight into the host's Dovecot account at
    a steady rate, each sender used at most 8 times (the reply limit answers one address 10
    times an hour), read by the poller (IDLE), answered by the demo automation, sent by SMTP;
  * direct `email.send` commands: an outbound_emails row and its command published through
    the management API, as the fault suite's direct commands are;
  * a trickle of failures: a direct mail to an address the SMTP sink refuses (550, through its
    runtime switch), dead-lettered `rejected`, then the switch removed and the dead letter put
    back with `worker-host dlq replay`, so that it is sent after all.

Exit status: 0 every check passed, 1 a check failed (each failure named), 2 the run could
not be made (setup, the host died).
"""

import argparse
import base64
import datetime
import imaplib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# How much a value may move before it counts as growth, and the bound on the queues.
RSS_TOLERANCE = 0.10  # RSS within 10 % of its value at the reference minute
SLACK = {"fds": 4, "threads": 2, "pg_conns": 2}  # above the highest value before the settle minute
# A leak holds what it took; a pool that opens a few connections for a burst closes them again.
# So descriptors, threads and connections are judged by the level they hold: the lowest of this
# many samples in a row. The highest single sample is reported, and connections are held to
# the ceiling the settings document (docs/SCALING.md, "What each replica costs").
HOLD_SAMPLES = 3
TABLE_TOLERANCE = 0.25  # bytes per mail after the settle minute within 25 % of those before it
TABLE_SLACK = 1 << 20  # plus 1 MiB per relation: page and B-tree split granularity, autovacuum's timing
SENDER_USES = 8  # mails from one sender, under the reply limit's 10 an hour


def die(message):
    print(f"soak: {message}", file=sys.stderr)
    sys.exit(2)


def say(message):
    print(f"soak: {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The services
# ---------------------------------------------------------------------------------------------


class Db:
    """psql against one database of the services' PostgreSQL."""

    def __init__(self, url):
        self.url = url

    def with_name(self, name):
        parts = urllib.parse.urlsplit(self.url)
        return Db(urllib.parse.urlunsplit(parts._replace(path="/" + name)))

    def rows(self, sql):
        done = subprocess.run(
            ["psql", self.url, "-XAtq", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql: {done.stderr.strip()}")
        return [line.split("\t") for line in done.stdout.splitlines() if line]

    def one(self, sql):
        rows = self.rows(sql)
        return rows[0][0] if rows else None


class Rabbit:
    """The management API (the services' admin user)."""

    def __init__(self, api):
        parts = urllib.parse.urlsplit(api)
        self.base = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}"
        token = f"{parts.username or 'guest'}:{parts.password or 'guest'}".encode()
        self.auth = "Basic " + base64.b64encode(token).decode()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        # The management listener refuses connections now and then while the machine is busy
        # (seen for a few seconds under a test run): a refused or broken call did nothing, so
        # it is tried again; an HTTP error answer is not.
        for attempt in range(6):
            request = urllib.request.Request(self.base + path, data=data, method=method)
            request.add_header("Authorization", self.auth)
            request.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    text = answer.read()
                return json.loads(text) if text else None
            except urllib.error.HTTPError:
                raise
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == 5:
                    raise
                time.sleep(2)

    def publish(self, vhost, exchange, key, message_id, payload):
        answer = self.call(
            "POST",
            f"/api/exchanges/{q(vhost)}/{q(exchange)}/publish",
            {
                "properties": {
                    "delivery_mode": 2,
                    "content_type": "application/json",
                    "message_id": message_id,
                },
                "routing_key": key,
                "payload": payload,
                "payload_encoding": "string",
            },
        )
        if not answer.get("routed"):
            raise RuntimeError(f"{exchange}/{key}: not routed")


def q(text):
    return urllib.parse.quote(text, safe="")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------


class Load:
    """The three streams, each on a thread of its own; counts what it put in."""

    def __init__(self, run, args, db, rabbit, vhost, imap, host_cmd):
        self.run, self.args, self.db, self.rabbit, self.vhost = run, args, db, rabbit, vhost
        self.imap, self.host_cmd = imap, host_cmd
        self.stop = threading.Event()
        self.pings = 0
        self.ping_lag = 0.0  # the longest an APPEND was behind its schedule, seconds
        self.expunged = 0  # the highest UID expunged, once the host had read it
        self.direct = 0
        self.failures = 0
        self.replays = 0
        self.errors = []
        self.fail_dir = os.environ.get("WH_SMTP_FAIL_DIR") or os.path.join(
            os.environ.get("WH_SERVICES_DIR", os.path.join(REPO, ".services")), "smtp-fail"
        )

    def start(self):
        self.threads = [
            threading.Thread(target=self.guard, args=(f,), daemon=True)
            for f in (self.pings_loop, self.direct_loop, self.failures_loop)
        ]
        for thread in self.threads:
            thread.start()

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def guard(self, loop):
        try:
            loop()
        except Exception as err:  # a stream that stops is a failed run, said at the end
            self.errors.append(f"{loop.__name__}: {err!r}")

    def pings_loop(self):
        host, port = self.imap
        session = imaplib.IMAP4(host, port)
        session.login(self.run["account"], "secret")
        to = f"{self.run['account']}@localhost"
        started = time.monotonic()
        i = 0
        while not self.stop.is_set():
            due = started + i / self.args.rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                self.ping_lag = max(self.ping_lag, -wait)
            sender = f"{self.run['prefix']}-s{i // SENDER_USES}@localhost"
            mail = (
                f"From: {sender}\r\nTo: {to}\r\nSubject: ping {i}\r\n"
                f"Message-ID: <soak-{uuid.uuid4().hex}@soak.test>\r\n\r\nare you there?\r\n"
            ).encode()
            status, _ = session.append("INBOX", None, None, mail)
            if status != "OK":
                raise RuntimeError(f"APPEND answered {status}")
            i += 1
            self.pings = i
            if i % int(max(1, self.args.rate * 30)) == 0:
                self.expunge_read(session)
        session.logout()

    def expunge_read(self, session):
        """Every 30 s, the pings the host has recorded are expunged: a Maildir of a whole
        hour's pings (180,000 files) makes each APPEND slower for Dovecot, and the generator
        falls behind its rate. The poller reads in UID order, so every UID up to the highest
        recorded has been read."""
        read = self.db.one("SELECT max(uid) FROM inbound_emails")
        if not read:
            return
        session.select("INBOX")
        session.uid("STORE", f"1:{read}", "+FLAGS.SILENT", "(\\Deleted)")
        session.close()  # expunges what is flagged, silently
        self.expunged = int(read)

    def outbound(self, to, subject):
        """An outbound_emails row to `to` and its email.send command."""
        mail_id = str(uuid.uuid4())
        self.db.rows(
            "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body) "
            f"VALUES ('{mail_id}', 'soak-{mail_id}@soak.test', ARRAY['{to}'], '{subject}', "
            "'a direct email.send command of the soak run')"
        )
        self.rabbit.publish(
            self.vhost, "commands", "email.send", mail_id,
            json.dumps({"email_message_id": mail_id}),
        )

    def direct_loop(self):
        started = time.monotonic()
        while not self.stop.wait(max(0.0, started + (self.direct + 1) * self.args.direct_every - time.monotonic())):
            try:
                self.outbound(f"{self.run['prefix']}-direct@localhost", f"direct {self.direct}")
                self.direct += 1
            except Exception as err:  # that command is lost; the stream goes on
                self.errors.append(f"direct command: {err!r}")

    def failures_loop(self):
        os.makedirs(self.fail_dir, exist_ok=True)
        refused = None
        while not self.stop.wait(self.args.fail_every):
            if refused:
                # The refused mail is a dead letter by now (a 550 is not retried): accept the
                # address again and put the dead letter back.
                os.unlink(refused)
                self.replay()
            address = f"{self.run['prefix']}-fail{self.failures}@localhost"
            refused = os.path.join(self.fail_dir, address)
            with open(refused, "w") as f:
                f.write("550 5.1.1 no such user (soak run)\n")
            os.chmod(refused, 0o644)
            try:
                self.outbound(address, f"refused {self.failures}")
                self.failures += 1
            except Exception as err:
                self.errors.append(f"refused mail: {err!r}")
        if refused:
            time.sleep(5)
            os.unlink(refused)
            self.replay()

    def replay(self):
        waiting = int(self.db.one("SELECT count(*) FROM dead_letters WHERE status = 'dead'") or 0)
        if not waiting:
            self.errors.append(f"replay {self.replays}: no dead letter archived")
            return
        done = subprocess.run(
            self.host_cmd + ["dlq", "replay", "--queue", "email.send", "--actor", "soak"],
            capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            self.errors.append(f"dlq replay: exit {done.returncode}: {done.stderr.strip()[-300:]}")
        else:
            self.replays += waiting


# ---------------------------------------------------------------------------------------------
# Samples
# ---------------------------------------------------------------------------------------------


def proc(pid):
    status = open(f"/proc/{pid}/status").read()
    field = lambda name: int(re.search(rf"^{name}:\s+(\d+)", status, re.M).group(1))
    # utime and stime, in clock ticks (fields 14 and 15; the command may hold spaces).
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {
        "rss_kib": field("VmRSS"),
        "threads": field("Threads"),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "cpu_ms": (int(stat[11]) + int(stat[12])) * 1000 // os.sysconf("SC_CLK_TCK"),
    }


def sample(t0, pid, db, dbname, rabbit, vhost, load):
    row = {"minute": round((time.monotonic() - t0) / 60, 2)}
    row.update(proc(pid))
    admin = Db(db.url).with_name("postgres")
    row["pg_conns"] = int(admin.one(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{dbname}'"))
    queues = rabbit.call("GET", f"/api/queues/{q(vhost)}?columns=name,messages")
    row["queued"] = sum(x.get("messages") or 0 for x in queues if not x["name"].endswith(".dead") and ".retry" not in x["name"])
    row["retrying"] = sum(x.get("messages") or 0 for x in queues if ".retry" in x["name"])
    row["dead_queued"] = sum(x.get("messages") or 0 for x in queues if x["name"].endswith(".dead"))
    counts = db.rows(
        "SELECT (SELECT count(*) FROM outbox WHERE status = 'pending'), "
        "(SELECT count(*) FROM outbound_emails), "
        "(SELECT count(*) FROM outbound_emails WHERE status = 'sent'), "
        "(SELECT count(*) FROM dead_letters WHERE status = 'dead'), "
        "pg_database_size(current_database())"
    )[0]
    row["outbox_pending"], row["mails"], row["sent"], row["dead_letters"], row["db_bytes"] = map(int, counts)
    row["pings"], row["direct"], row["failures"] = load.pings, load.direct, load.failures
    row["relations"] = {
        name: {"kind": kind, "bytes": int(size)}
        for name, kind, size in db.rows(
            "SELECT c.relname, CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END, "
            "pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'p')"
        )
    }
    return row


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def at(samples, minute):
    """The first sample at or after `minute`."""
    return next((s for s in samples if s["minute"] >= minute), samples[-1])


def held_level(samples, key):
    """The sample that starts the highest level held for HOLD_SAMPLES samples in a row, its
    value replaced by that level (the lowest of those samples); with fewer samples, the lowest."""
    span = min(HOLD_SAMPLES, len(samples))
    runs = [samples[i:i + span] for i in range(len(samples) - span + 1)]
    levels = [dict(run[0], **{key: min(s[key] for s in run)}) for run in runs]
    return max(levels, key=lambda s: s[key])


def pg_ceiling(text):
    """The most connections the settings let one replica open: the jobs' pool, its three
    connections of its own (the outbox and pause listeners, the health probe) and the console's."""
    settings = tomllib.loads(text)
    return settings["database"]["max_connections"] + 3 + settings["admin"]["console_connections"]


def checks(samples, args, near):
    """[(name, passed, figures)]."""
    out = []
    during = [s for s in samples if not s.get("after")]
    ref = at(during, args.rss_ref)
    settle = at(during, args.settle)
    before = [s for s in during if s["minute"] <= settle["minute"]]
    later = [s for s in during if s["minute"] >= settle["minute"]]
    limit = ref["rss_kib"] * (1 + RSS_TOLERANCE)
    worst = max(later, key=lambda s: s["rss_kib"])
    out.append((
        "RSS",
        worst["rss_kib"] <= limit,
        f"highest {worst['rss_kib'] / 1024:.1f} MiB at minute {worst['minute']}, "
        f"{ref['rss_kib'] / 1024:.1f} MiB at minute {ref['minute']} (limit +{RSS_TOLERANCE:.0%}: {limit / 1024:.1f} MiB)",
    ))
    for key, label in (("fds", "file descriptors"), ("threads", "threads"), ("pg_conns", "PostgreSQL connections")):
        base = max(s[key] for s in before)
        held = held_level(later, key)
        top = max(later, key=lambda s: s[key])
        passed = held[key] <= base + SLACK[key]
        figures = (
            f"held {held[key]} ({HOLD_SAMPLES} samples from minute {held['minute']}) after minute "
            f"{settle['minute']}, highest before {base} (slack {SLACK[key]}); highest sample {top[key]} "
            f"at minute {top['minute']}"
        )
        if key == "pg_conns":
            passed = passed and top[key] <= args.pg_ceiling
            figures += f" (ceiling {args.pg_ceiling})"
        out.append((label, passed, figures))
    for key, label in (("queued", "work queues"), ("outbox_pending", "outbox pending rows")):
        top = max(later, key=lambda s: s[key])
        out.append((
            f"{label} near empty",
            top[key] <= near,
            f"highest {top[key]} at minute {top['minute']} (bound {near})",
        ))
    end = during[-1]
    grew = []
    for name, rel in end["relations"].items():
        start = settle["relations"].get(name, {"bytes": 0})["bytes"]
        mails_then, mails_now = max(settle["mails"], 1), end["mails"]
        allowed = start / mails_then * (1 + TABLE_TOLERANCE) * (mails_now - mails_then) + TABLE_SLACK
        if rel["bytes"] - start > allowed:
            grew.append(f"{name} +{(rel['bytes'] - start) / 1024:.0f} KiB (allowed {allowed / 1024:.0f})")
    out.append((
        "tables and indexes grow with the mails they hold",
        not grew,
        "; ".join(grew) or f"every relation within {TABLE_TOLERANCE:.0%} of its bytes per mail at minute {settle['minute']} (+1 MiB)",
    ))
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def mib(n):
    return f"{n / 1048576:.1f}"


def report(path, samples, results, meta, args, near, svg_name):
    during = [s for s in samples if not s.get("after")]
    settle = at(during, args.settle)
    end = during[-1]
    lines = [
        f"# Soak run {meta['run']}",
        "",
        f"`{meta['command']}` on {meta['date']} (commit {meta['commit']}, host binary `{meta['binary']}`).",
        f"{args.minutes} minutes at {args.rate} pings/s through IMAP APPEND, a direct email.send every "
        f"{args.direct_every} s, a refused mail dead-lettered and replayed every {args.fail_every} s; "
        f"sampled every {args.sample} s. Checks from minute {args.settle} on, RSS against minute {args.rss_ref}.",
        "Tokio tasks are not sampled: the host exposes no task count (/metrics and /status have none).",
        "",
        f"![samples]({svg_name})",
        "",
        "| check | result | figures |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'pass' if ok else '**FAIL**'} | {text} |" for name, ok, text in results]
    lines += [
        "",
        f"Load put in: {meta['pings']} pings, {meta['direct']} direct commands, {meta['failures']} refused "
        f"mails ({meta['replays']} dead letters replayed); longest APPEND behind schedule {meta['ping_lag']:.1f} s. "
        f"After the load: {meta['sent']} of {meta['mails']} mails sent, {meta['dead_left']} dead letters left, "
        f"{meta['unsent']} unsent. Stream errors: {meta['errors'] or 'none'}. Samples lost: {meta['lost'] or 'none'}.",
        "",
        "| minute | RSS MiB | fds | threads | PG conns | queued | in retry tiers | outbox pending | pings | mails | sent | dead letters | DB MiB | host CPU ms per mail since the last sample |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    previous = None
    for s in samples:
        mark = " (after)" if s.get("after") else ""
        lines.append(
            f"| {s['minute']}{mark} | {s['rss_kib'] / 1024:.1f} | {s['fds']} | {s['threads']} | {s['pg_conns']} | "
            f"{s['queued']} | {s['retrying']} | {s['outbox_pending']} | {s['pings']} | {s['mails']} | {s['sent']} | "
            f"{s['dead_letters']} | {mib(s['db_bytes'])} | {cpu_per_mail(previous, s)} |"
        )
        previous = s
    lines += [
        "",
        f"The host's CPU from minute {settle['minute']} to minute {end['minute']}: "
        f"{cpu_per_mail(settle, end)} ms per mail sent (user and system, from /proc/<pid>/stat).",
        "",
        f"Each relation (pg_total_relation_size: a table with its TOAST and indexes, an index alone) at minute "
        f"{settle['minute']} ({settle['mails']} mails) and at minute {end['minute']} ({end['mails']} mails); "
        "relations under 64 KiB at the end are left out.",
        "",
        f"| relation | kind | KiB at {settle['minute']} | KiB at {end['minute']} | bytes/mail at {settle['minute']} | "
        f"bytes/mail at {end['minute']} | bytes per mail since |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    rels = sorted(end["relations"].items(), key=lambda kv: -kv[1]["bytes"])
    for name, rel in rels:
        if rel["bytes"] < 65536:
            continue
        start = settle["relations"].get(name, {"bytes": 0})["bytes"]
        since = (rel["bytes"] - start) / max(end["mails"] - settle["mails"], 1)
        lines.append(
            f"| {name} | {rel['kind']} | {start // 1024} | {rel['bytes'] // 1024} | "
            f"{start / max(settle['mails'], 1):.0f} | {rel['bytes'] / max(end['mails'], 1):.0f} | {since:.0f} |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def cpu_per_mail(before, after):
    """The host's CPU per mail sent between two samples, in ms ("-" without both, or no mail)."""
    if not before or "cpu_ms" not in before or "cpu_ms" not in after:
        return "-"
    sent = after["sent"] - before["sent"]
    return f"{(after['cpu_ms'] - before['cpu_ms']) / sent:.2f}" if sent > 0 else "-"


def chart(path, samples, title):
    """An SVG of the samples, drawn by gnuplot."""
    data = path + ".tsv"
    first = samples[0]
    with open(data, "w") as f:
        for s in samples:
            # The database's growth per mail since the first sample: flat when it grows with
            # the mails (the empty schema's own size left out).
            mails = s["mails"] - first["mails"]
            per_mail = f"{(s['db_bytes'] - first['db_bytes']) / mails / 1024:.2f}" if mails > 0 else "?"
            f.write(
                f"{s['minute']}\t{s['rss_kib'] / 1024:.2f}\t{s['fds']}\t{s['threads']}\t{s['pg_conns']}\t"
                f"{s['queued']}\t{s['outbox_pending']}\t{per_mail}\t{s['db_bytes'] / 1048576:.2f}\n"
            )
    script = f"""
set terminal svg size 900,900 dynamic font 'sans,11'
set output '{path}'
set multiplot layout 4,1 title '{title}'
set xlabel 'minute'
set grid
set key outside right
set yrange [0:*]
set xrange [0:*]
plot '{data}' using 1:2 with linespoints title 'RSS MiB'
plot '{data}' using 1:3 with linespoints title 'fds', '' using 1:4 with linespoints title 'threads', '' using 1:5 with linespoints title 'PG conns'
plot '{data}' using 1:6 with linespoints title 'queued', '' using 1:7 with linespoints title 'outbox pending'
set y2tics
set y2range [0:*]
set datafile missing '?'
plot '{data}' using 1:8 with linespoints title 'DB growth, KiB per mail', '' using 1:9 with linespoints axes x1y2 title 'DB MiB (right)'
unset multiplot
"""
    done = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    os.unlink(data)
    if done.returncode != 0:
        say(f"gnuplot failed: {done.stderr.strip()}")


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def settings_file(path, run, imap):
    """The shipped example, as it is, but for the IMAP account and the demo automation; where
    the services are comes from the environment (WORKER_HOST__...)."""
    text = open(os.path.join(REPO, "config", "worker-host.example.toml")).read()
    host, port = imap
    account = (
        f'accounts = [{{ name = "soak", host = "{host}", port = {port}, security = "plain", '
        f'username = "{run["account"]}", password = "secret" }}]'
    )
    text, n = re.subn(r"^accounts = \[\]$", account, text, count=1, flags=re.M)
    demo = os.path.join(REPO, "config", "automations.demo.toml")
    text, m = re.subn(r"^automations_files = \[\]$", f'automations_files = ["{demo}"]', text, count=1, flags=re.M)
    if n != 1 or m != 1:
        die("config/worker-host.example.toml no longer has `accounts = []` and `automations_files = []`")
    with open(path, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=50, help="pings a second")
    parser.add_argument("--sample", type=float, default=60, help="seconds between samples")
    parser.add_argument("--settle", type=float, help="minute from which nothing may grow (default: a sixth of the run, 10 of 60)")
    parser.add_argument("--rss-ref", type=float, help="minute whose RSS is the reference (default: a twelfth, 5 of 60)")
    parser.add_argument("--direct-every", type=float, default=1.0, help="seconds between direct email.send commands")
    parser.add_argument("--fail-every", type=float, default=30.0, help="seconds between refused mails (each replayed)")
    parser.add_argument("--out", required=True, help="folder for report.md, samples.json and chart.svg")
    parser.add_argument("--keep", action="store_true", help="keep the database, vhost and mailboxes")
    parser.add_argument("--command", default="scripts/soak.sh")
    args = parser.parse_args()
    args.settle = args.minutes / 6 if args.settle is None else args.settle
    args.rss_ref = args.minutes / 12 if args.rss_ref is None else args.rss_ref
    near = int(max(20, args.rate * 5))  # five seconds of load

    for var in ("WH_TEST_DATABASE_URL", "WH_TEST_RABBIT_API", "WH_TEST_AMQP_URL", "WH_TEST_IMAP", "WH_TEST_SMTP"):
        if not os.environ.get(var):
            die(f"{var} is not set: run from scripts/soak.sh (it reads scripts/services.sh env)")
    if not shutil.which("gnuplot"):
        die("gnuplot is missing: apt-get install gnuplot-nox")
    os.makedirs(args.out, exist_ok=True)

    short = uuid.uuid4().hex[:8]
    run = {"id": short, "db": f"soak_{short}", "vhost": f"soak_{short}", "account": f"soak-{short}", "prefix": f"soak-{short}"}
    server = Db(os.environ["WH_TEST_DATABASE_URL"])
    db = server.with_name(run["db"])
    rabbit = Rabbit(os.environ["WH_TEST_RABBIT_API"])
    amqp = urllib.parse.urlsplit(os.environ["WH_TEST_AMQP_URL"])
    pg = urllib.parse.urlsplit(server.url)
    imap_host, imap_port = os.environ["WH_TEST_IMAP"].rsplit(":", 1)
    smtp_host, smtp_port = os.environ["WH_TEST_SMTP"].rsplit(":", 1)
    imap = (imap_host, int(imap_port))

    server.rows(f"CREATE DATABASE {run['db']}")
    rabbit.call("PUT", f"/api/vhosts/{q(run['vhost'])}", {})
    rabbit.call("PUT", f"/api/permissions/{q(run['vhost'])}/{q(amqp.username or 'guest')}",
                {"configure": ".*", "write": ".*", "read": ".*"})
    config = os.path.join(args.out, "worker-host.toml")
    settings_file(config, run, imap)
    args.pg_ceiling = pg_ceiling(open(config).read())
    port = free_port()
    env = dict(os.environ)
    env.update({
        "WORKER_HOST__DATABASE__HOST": pg.hostname,
        "WORKER_HOST__DATABASE__PORT": str(pg.port or 5432),
        "WORKER_HOST__DATABASE__NAME": run["db"],
        "WORKER_HOST__DATABASE__USERNAME": pg.username,
        "WORKER_HOST__DATABASE__PASSWORD": pg.password or "",
        "WORKER_HOST__BROKER__HOST": amqp.hostname,
        "WORKER_HOST__BROKER__PORT": str(amqp.port or 5672),
        "WORKER_HOST__BROKER__VHOST": run["vhost"],
        "WORKER_HOST__BROKER__USERNAME": amqp.username or "guest",
        "WORKER_HOST__BROKER__PASSWORD": amqp.password or "guest",
        "WORKER_HOST__SMTP__HOST": smtp_host,
        "WORKER_HOST__SMTP__PORT": smtp_port,
        "WORKER_HOST__ADMIN__LISTEN": f"127.0.0.1:{port}",
        "WORKER_HOST__INSTALLATION": f"soak-{short}",
    })
    env.pop("RUST_LOG", None)
    host_cmd = [args.binary, "--config", config]
    log = open(os.path.join(args.out, "host.log"), "w")
    # Start the account's history before the host first looks at it: a poller that starts
    # after the mail already there would otherwise skip the first pings.
    session = imaplib.IMAP4(*imap)
    session.login(run["account"], "secret")
    session.logout()
    host = subprocess.Popen(host_cmd + ["run"], env=env, stdout=log, stderr=subprocess.STDOUT)
    os.environ.update({k: v for k, v in env.items() if k.startswith("WORKER_HOST__")})
    say(f"run {short}: host pid {host.pid}, admin 127.0.0.1:{port}, database {run['db']}, vhost {run['vhost']}, out {args.out}")

    def ready():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except Exception:
            return False

    deadline = time.monotonic() + 120
    while not ready():
        if host.poll() is not None or time.monotonic() > deadline:
            die(f"the host did not become ready (see {args.out}/host.log)")
        time.sleep(0.5)
    time.sleep(3)  # the account's first poll, which starts after its history

    load = Load(run, args, db, rabbit, run["vhost"], imap, host_cmd)
    samples = []
    lost = []
    t0 = time.monotonic()
    load.start()
    say(f"load on: {args.rate} pings/s for {args.minutes} min, a sample every {args.sample} s")
    status = 0
    try:
        n = 0
        while True:
            due = t0 + n * args.sample
            if due > t0 + args.minutes * 60 + 0.5:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            if host.poll() is not None:
                die(f"the host exited ({host.returncode}) at minute {(time.monotonic() - t0) / 60:.1f}: see {args.out}/host.log")
            try:
                s = sample(t0, host.pid, db, run["db"], rabbit, run["vhost"], load)
            except Exception as err:  # a service that did not answer this time: a gap in the table
                lost.append(f"minute {(time.monotonic() - t0) / 60:.2f}: {err!r}")
                say(f"sample lost: {lost[-1]}")
                n += 1
                continue
            samples.append(s)
            say(f"minute {s['minute']:>6}: RSS {s['rss_kib'] / 1024:.1f} MiB, fds {s['fds']}, threads {s['threads']}, "
                f"PG conns {s['pg_conns']}, queued {s['queued']}, outbox pending {s['outbox_pending']}, "
                f"mails {s['mails']} ({s['sent']} sent), DB {mib(s['db_bytes'])} MiB")
            n += 1
        load.finish()
        # Let what is in flight finish: every mail sent, the replayed ones too.
        expected = load.pings + load.direct + load.failures
        drained = time.monotonic() + 120
        while time.monotonic() < drained:
            sent = int(db.one("SELECT count(*) FROM outbound_emails WHERE status = 'sent'"))
            if sent >= expected:
                break
            time.sleep(2)
        # The shared PostgreSQL may have no connection slot to spare for a moment (seen once
        # while the test suite ran): the closing sample is tried again before giving up.
        for attempt in range(10):
            try:
                after = sample(t0, host.pid, db, run["db"], rabbit, run["vhost"], load)
                break
            except Exception as err:
                if attempt == 9:
                    die(f"the closing sample failed: {err!r}")
                time.sleep(3)
        after["after"] = True
        samples.append(after)
        if len(lost) * 3 > len(samples):
            die(f"{len(lost)} samples lost of {len(lost) + len(samples)}: " + "; ".join(lost))
        results = checks(samples, args, near)
        unsent = expected - after["sent"]
        results.append((
            "every mail sent once the load stopped",
            unsent <= 0 and not load.errors,
            f"{after['sent']} sent of {expected} put in ({load.pings} pings, {load.direct} direct, {load.failures} refused then replayed)"
            + (f"; stream errors: {'; '.join(load.errors)}" if load.errors else ""),
        ))
        meta = {
            "run": short,
            "command": args.command,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "binary": os.path.relpath(args.binary, REPO) if args.binary.startswith(REPO) else args.binary,
            "pings": load.pings, "direct": load.direct, "failures": load.failures, "replays": load.replays,
            "ping_lag": load.ping_lag, "sent": after["sent"], "mails": after["mails"],
            "dead_left": after["dead_letters"], "unsent": max(unsent, 0), "errors": "; ".join(load.errors),
            "lost": "; ".join(lost),
        }
        with open(os.path.join(args.out, "samples.json"), "w") as f:
            json.dump({"meta": meta, "samples": samples}, f)
        chart(os.path.join(args.out, "chart.svg"), samples,
              f"soak: {args.minutes:g} min at {args.rate:g} pings/s ({meta['date']})")
        report(os.path.join(args.out, "report.md"), samples, results, meta, args, near, "chart.svg")
        for name, ok, text in results:
            print(f"{'pass' if ok else 'FAIL'}  {name}: {text}")
        failed = [name for name, ok, _ in results if not ok]
        if failed:
            say("failed: " + ", ".join(failed))
            status = 1
        else:
            say("every check passed")
        say(f"report: {args.out}/report.md, chart: {args.out}/chart.svg")
    finally:
        load.stop.set()
        if host.poll() is None:
            host.send_signal(signal.SIGTERM)
            try:
                host.wait(timeout=60)
            except subprocess.TimeoutExpired:
                host.kill()
        if not args.keep:
            cleanup(server, rabbit, run)
    sys.exit(status)


def cleanup(server, rabbit, run):
    # Without FORCE: an autovacuum worker on the database (a superuser's) is told to go by a
    # plain DROP, where FORCE would need the right to signal it; the host has stopped by now.
    for attempt in range(5):
        try:
            server.rows(f"DROP DATABASE IF EXISTS {run['db']}")
            break
        except Exception as err:
            if attempt == 4:
                say(f"cleanup: database {run['db']} left: {err}")
            time.sleep(2)
    try:
        rabbit.call("DELETE", f"/api/vhosts/{q(run['vhost'])}")
    except Exception as err:
        say(f"cleanup: vhost {run['vhost']} left: {err!r}")
    mail = os.environ.get("WH_MAIL_DIR") or os.path.join(
        os.environ.get("WH_SERVICES_DIR", os.path.join(REPO, ".services")), "mail"
    )
    if os.path.isdir(mail):
        for name in os.listdir(mail):
            if name.startswith(run["prefix"]):
                shutil.rmtree(os.path.join(mail, name), ignore_errors=True)


if __name__ == "__main__":
    main()
