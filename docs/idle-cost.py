#!/usr/bin/env python3
"""What each way of learning of new mail costs the IMAP server per idle account, side by side.

N sessions per way, all at once on the server of `scripts/services.sh` (WH_TEST_IMAP,
WH_TEST_SMTP), then a fixed window in which every server process's CPU is read from
/proc/<pid>/stat (utime+stime) and /proc/<pid>/schedstat (on-CPU ns) before and after. The
server process of each session is found by its TCP port (`ss -tnp`, so run it as root, as the
server's processes are another user's). Then PINGS mails to one account of each way in turn,
each timed from the SMTP server's acceptance to the IMAP server's `EXISTS` on that session.

    cd /work/main && eval "$(scripts/services.sh env)"
    N=10 WINDOW=60 PINGS=30 MODES=idle,idle250,noop150,noop125,pipe150,notify python3 docs/idle-cost.py

Ways: `idle` (plain IDLE, the server's own notices), `idleMS` (DONE, then a new IDLE after
its answer, every MS ms: the poller's `idle_recheck_with = "idle"`), `pipeMS` (DONE and the
next IDLE in one write), `noopMS` (a NOOP every MS ms on a session out of IDLE: the poller's
`idle_recheck_with = "noop"`), `notify` (RFC 5465 NOTIFY SET for the selected mailbox, no IDLE).
"""
import asyncio, os, smtplib, subprocess, sys, time, uuid

IMAP_HOST, IMAP_PORT = os.environ.get("WH_TEST_IMAP", "127.0.0.1:10143").rsplit(":", 1)
SMTP_HOST, SMTP_PORT = os.environ.get("WH_TEST_SMTP", "127.0.0.1:2525").rsplit(":", 1)
N = int(os.environ.get("N", "10"))
WINDOW = float(os.environ.get("WINDOW", "60"))
PINGS = int(os.environ.get("PINGS", "30"))
MODES = os.environ.get("MODES", "idle,idle250,noop150,noop125,pipe150,notify").split(",")
RUN = uuid.uuid4().hex[:6]


class Session:
    def __init__(self, user, mode):
        self.user, self.mode, self.tag, self.exists, self.commands = user, mode, 0, 0, 0
        self.seen, self.seen_at = asyncio.Event(), None

    async def open(self):
        self.r, self.w = await asyncio.open_connection(IMAP_HOST, int(IMAP_PORT))
        self.port = self.w.get_extra_info("sockname")[1]
        await self.r.readline()
        await self.command(f"LOGIN {self.user} secret")
        await self.command("EXAMINE INBOX")
        if self.mode == "notify":
            await self.command("NOTIFY SET (selected (MessageNew MessageExpunge))")

    async def line(self):
        line = (await self.r.readline()).decode(errors="replace").rstrip("\r\n")
        if not line:
            raise EOFError(self.user)
        words = line.split()
        if len(words) >= 3 and words[0] == "*" and words[2] == "EXISTS" and int(words[1]) > self.exists:
            self.exists, self.seen_at = int(words[1]), time.time()
            self.seen.set()
        return line

    async def send(self, command):
        self.tag += 1
        self.commands += 1
        tag = f"a{self.tag}"
        self.w.write(f"{tag} {command}\r\n".encode())
        await self.w.drain()
        return tag

    async def command(self, command):
        tag = await self.send(command)
        while not (await self.line()).startswith(tag + " "):
            pass

    async def read_until(self, end, stop):
        while time.time() < end and not stop.is_set():
            try:
                await asyncio.wait_for(self.line(), timeout=max(0.001, min(end - time.time(), 0.05)))
            except asyncio.TimeoutError:
                pass

    async def run(self, stop):
        mode = self.mode
        if mode in ("idle", "notify"):
            if mode == "idle":
                await self.send("IDLE")
            await self.read_until(float("inf"), stop)
        elif mode.startswith("idle"):
            every = int(mode[4:]) / 1000
            while not stop.is_set():
                tag = await self.send("IDLE")
                while not (await self.line()).startswith("+"):
                    pass
                await self.read_until(time.time() + every, stop)
                self.w.write(b"DONE\r\n")
                self.commands += 1
                await self.w.drain()
                while not (await self.line()).startswith(tag + " "):
                    pass
        elif mode.startswith("pipe"):
            every = int(mode[4:]) / 1000
            await self.send("IDLE")
            while not (await self.line()).startswith("+"):
                pass
            while not stop.is_set():
                await self.read_until(time.time() + every, stop)
                self.tag += 1
                self.commands += 2
                self.w.write(f"DONE\r\na{self.tag} IDLE\r\n".encode())
                await self.w.drain()
                while not (await self.line()).startswith("+"):
                    pass
        elif mode.startswith("noop"):
            every = int(mode[4:]) / 1000
            while not stop.is_set():
                next_at = time.time() + every
                await self.command("NOOP")
                await self.read_until(next_at, stop)
        else:
            sys.exit(f"unknown way {mode}")


def server_pids():
    """The server process on the other end of each local port."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True).stdout
    pids = {}
    for line in out.splitlines():
        fields = line.split()
        if fields[2].endswith(":" + IMAP_PORT) and "pid=" in line:
            pids[int(fields[3].rsplit(":", 1)[1])] = int(line.split("pid=")[1].split(",")[0])
    return pids


def cpu(pid):
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    ticks = int(stat[11]) + int(stat[12])
    return ticks, int(open(f"/proc/{pid}/schedstat").read().split()[0])


def ping(user):
    with smtplib.SMTP(SMTP_HOST, int(SMTP_PORT)) as smtp:
        smtp.sendmail("probe@localhost", [f"{user}@localhost"],
                      f"From: probe@localhost\r\nTo: {user}@localhost\r\nSubject: ping\r\n\r\nhi\r\n")
    return time.time()


def percentile(values, q):
    values = sorted(values)
    rank = -(-q * len(values) // 1)
    return values[int(min(len(values), max(1, rank))) - 1]


async def main():
    ways = {m: [Session(f"idle-cost-{RUN}-{m}-{i}", m) for i in range(N)] for m in MODES}
    sessions = [s for group in ways.values() for s in group]
    await asyncio.gather(*(s.open() for s in sessions))
    pids = server_pids()
    for s in sessions:
        s.pid = pids[s.port]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stop)) for s in sessions]
    await asyncio.sleep(2)
    tick = os.sysconf("SC_CLK_TCK")
    before = {s.user: (cpu(s.pid), s.commands) for s in sessions}
    start = time.time()
    await asyncio.sleep(WINDOW)
    after = {s.user: (cpu(s.pid), s.commands) for s in sessions}
    span = time.time() - start
    print(f"IMAP server CPU per idle account: {N} accounts per way, one {span:.0f} s window, side by side")
    print("| way | CPU ms per account per s (stat) | CPU ms per account per s (schedstat) | commands per account per s | CPU us per command (schedstat) |")
    print("|---|---:|---:|---:|---:|")
    for mode, group in ways.items():
        ticks = sum(after[s.user][0][0] - before[s.user][0][0] for s in group)
        ns = sum(after[s.user][0][1] - before[s.user][0][1] for s in group)
        commands = sum(after[s.user][1] - before[s.user][1] for s in group) / len(group) / span
        stat_ms = ticks * 1000 / tick / len(group) / span
        sched_ms = ns / 1e6 / len(group) / span
        per_command = f"{sched_ms * 1000 / commands:.0f}" if commands else "-"
        print(f"| {mode} | {stat_ms:.3f} | {sched_ms:.3f} | {commands:.1f} | {per_command} |", flush=True)

    loop = asyncio.get_running_loop()
    waits = {m: [] for m in MODES}
    for _ in range(PINGS):
        for mode in MODES:
            s = ways[mode][0]
            s.seen.clear()
            sent = await loop.run_in_executor(None, ping, s.user)
            try:
                await asyncio.wait_for(s.seen.wait(), 5)
                waits[mode].append(max(0.0, (s.seen_at - sent) * 1000))
            except asyncio.TimeoutError:
                waits[mode].append(5000.0)
            await asyncio.sleep(0.05)
    print()
    print("| way | pings | accepted to EXISTS p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES:
        v = waits[mode]
        print(f"| {mode} | {len(v)} | {percentile(v, 0.5):.0f} | {percentile(v, 0.99):.0f} | {max(v):.0f} |")
    stop.set()
    for t in tasks:
        t.cancel()


asyncio.run(main())
