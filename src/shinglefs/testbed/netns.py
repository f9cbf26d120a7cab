"""Test hosts on one machine: Linux network namespaces joined by a bridge.

Used by the multi-host tests (tests/cluster, through tests/support/netns.py)
and by ``shinglefs bench cluster``.

``Cluster.create(["s1", "s2", "a"], log_dir)`` builds one network namespace
per host name, named ``PREFIX<pid>-<host>`` (``pid``: this test session), and
a Linux bridge ``PREFIX<pid>br`` in the root namespace holding ``.1`` of a
private ``10.213.X.0/24`` (the first X, from the session's pid on, whose
network overlaps no address or route of the root namespace; 172.29.0.0/16,
then 192.168.0.0/16 if every one does). Each host gets
one veth pair: ``PREFIX<pid>v<i>`` on the bridge, ``eth0`` inside the
namespace with address ``.(10+i)``, and its loopback up. So hosts reach each
other and the bridge address (where the session's PostgreSQL listens, see
``testbed.pgcluster.PgCluster.start(listen=...)``), and nothing else: no default
route, no NAT, no forwarding out of the machine.

Processes: ``spawn(host, argv)`` starts ``ip netns exec NS argv...`` (``ip``
execs the command, so the process id is the command's own and ``kill -9``
reaches it), stdout and stderr in ``log_dir/<label>.out|.err``. Every process
has a bounded lifetime: it is killed after ``lifetime`` seconds, and it gets
SIGKILL when the test session's process dies (``PR_SET_PDEATHSIG``), so a
killed session leaves no server running (the signal follows the *thread*
that spawned: spawn from the test's own thread). ``run(host, argv, timeout)``
is the blocking form.

Teardown (``close``, idempotent; the fixture calls it in a ``finally``, and
it is registered with ``atexit``): every process in the namespaces is
killed, then namespaces (taking their veth pairs with them) and the bridge
are deleted. At ``create``, leftovers of a crashed earlier session — names
with this prefix whose pid no longer runs — are removed the same way; a
concurrent session's (pid alive) are left alone.

Requires CAP_NET_ADMIN and CAP_SYS_ADMIN (``ip netns add`` mounts the
namespace; root has both outside a restricted container);
``unavailable_reason()`` says which is missing, and the fixture skips with
it. Any other failure — ``ip`` missing included — raises ``NetnsError``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "sfst"
# Private ranges to take a /24 from, in order (the first where one is free).
SUBNET_BASES = tuple(ipaddress.IPv4Network(n) for n in
                     ("10.213.0.0/16", "172.29.0.0/16", "192.168.0.0/16"))
HOST_OFFSET = 10  # host i gets .(10+i); .1 is the bridge
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_PR_SET_PDEATHSIG = 1


class NetnsError(RuntimeError):
    """Building or tearing down the test network failed (carries ``ip``'s message)."""


def unavailable_reason() -> str | None:
    """Why this process cannot build network namespaces (missing capabilities),
    or None when it can. Root in a container without them counts as unable."""
    try:
        found = re.search(r"^CapEff:\s*([0-9a-f]+)", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        found = None
    if found is None:
        return None if os.geteuid() == 0 else "not root (capabilities unreadable)"
    caps = int(found.group(1), 16)
    missing = [name for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"),
                                      (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if missing:
        who = "root" if os.geteuid() == 0 else "this user"
        return f"`ip netns` needs CAP_NET_ADMIN and CAP_SYS_ADMIN; {who} lacks {', '.join(missing)}"
    return None


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_pids(netns: str) -> None:
    """SIGKILL every process inside ``netns`` and wait (bounded) until they are gone."""
    deadline = time.monotonic() + 10
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).split() if p.isdigit()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def remove_leftovers(prefix: str = PREFIX, *, only_dead: bool = True) -> list[str]:
    """Delete namespaces and links named ``prefix<pid>...`` whose session pid no
    longer runs (``only_dead=False``: all of them). Returns what was removed."""
    owned = re.compile(rf"^{re.escape(prefix)}(\d+)")

    def stale(name: str) -> bool:
        match = owned.match(name)
        return match is not None and not (only_dead and _pid_alive(int(match.group(1))))

    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if stale(name):
            _kill_namespace_pids(name)
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    for link in json.loads(_ip("-j", "link", "show") or "[]"):
        name = str(link.get("ifname", ""))
        if stale(name):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def choose_subnet(start: int) -> ipaddress.IPv4Network:
    """A /24 of ``SUBNET_BASES`` (the ``start``-th on, wrapping) overlapping no
    address or route of the root namespace."""
    used: list[ipaddress.IPv4Network] = []
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = str(route.get("dst", ""))
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(_ip("-j", "-4", "addr", "show") or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}",
                                                  strict=False))
    for base in SUBNET_BASES:
        subnets = list(base.subnets(new_prefix=24))
        for i in range(len(subnets)):
            candidate = subnets[(start + i) % len(subnets)]
            if not any(candidate.overlaps(net) for net in used):
                return candidate
    raise NetnsError("every /24 of " + ", ".join(map(str, SUBNET_BASES))
                     + " overlaps an address or route of this machine")


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen after fork


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace with one address on the bridge's subnet."""

    name: str
    netns: str
    address: str
    veth: str


class HostProcess:
    """A process running inside a host's namespace (see ``Cluster.spawn``)."""

    def __init__(self, host: Host, label: str, argv: Sequence[str], log_dir: Path,
                 lifetime: float, env: dict[str, str] | None) -> None:
        self.host = host
        self.label = label
        self.out_path = log_dir / f"{label}.out"
        self.err_path = log_dir / f"{label}.err"
        self.lifetime_expired = False
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, *argv], stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, env=env, preexec_fn=_die_with_parent)
        self._timer = threading.Timer(lifetime, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _expire(self) -> None:
        if self.popen.poll() is None:
            self.lifetime_expired = True
            self.kill()

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def errors(self) -> str:
        return self.err_path.read_text(errors="replace")

    def json_lines(self) -> list[dict[str, object]]:
        """Every stdout line that is a JSON object (complete lines only)."""
        found = []
        for line in self.output().splitlines(keepends=True):
            if line.endswith("\n") and line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    def describe(self) -> str:
        state = self.popen.poll()
        return (f"{self.label} on {self.host.name} (pid {self.pid}, "
                f"{'running' if state is None else f'exit {state}'}"
                f"{', lifetime expired' if self.lifetime_expired else ''})\n"
                f"--- stdout\n{self.output()[-3000:]}\n--- stderr\n{self.errors()[-3000:]}")

    def wait_for(self, condition: Callable[[HostProcess], bool], what: str,
                 limit: float = 30.0) -> None:
        """Poll until ``condition(self)``; fails naming ``what`` if the process
        exits first or ``limit`` seconds pass (a bound against hangs)."""
        deadline = time.monotonic() + limit
        while not condition(self):
            if self.popen.poll() is not None and not condition(self):
                raise AssertionError(f"{what}: the process exited first: {self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {limit:g} s: {self.describe()}")
            time.sleep(0.005)

    def wait_line(self, text: str, limit: float = 30.0) -> None:
        """Wait until a complete stdout line equals ``text`` or starts with it."""
        self.wait_for(lambda p: any(line.startswith(text) for line in
                                    p.output().splitlines(keepends=True)
                                    if line.endswith("\n")),
                      f"{self.label} printing {text!r}", limit)

    def wait(self, limit: float = 60.0) -> int:
        """Wait for the exit (at most ``limit`` s, then kill it and fail); the exit code."""
        try:
            return self.popen.wait(limit)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.label} did not exit within {limit:g} s: "
                                 f"{self.describe()}") from None
        finally:
            if self.popen.returncode is not None:
                self._timer.cancel()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace`` s; returns the exit code."""
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
                self.popen.wait(10)
        self._timer.cancel()
        return int(self.popen.returncode)


class Cluster:
    """Namespaces, a bridge and the processes in them. Build with ``create``;
    ``close`` tears everything down (see the module docstring)."""

    def __init__(self, prefix: str, subnet: ipaddress.IPv4Network, log_dir: Path) -> None:
        self.prefix = f"{prefix}{os.getpid()}"
        self.subnet = subnet
        self.bridge = f"{self.prefix}br"
        self.bridge_address = str(subnet.network_address + 1)
        self.log_dir = log_dir
        self.hosts: dict[str, Host] = {}
        self._processes: list[HostProcess] = []
        self._labels: dict[str, int] = {}
        self._closed = False

    @classmethod
    def create(cls, names: Sequence[str], log_dir: Path, *, prefix: str = PREFIX) -> Cluster:
        """Build the bridge and one namespace per name. Raises ``NetnsError``."""
        if len(names) > 200 or len(set(names)) != len(names):
            raise ValueError("host names must be distinct, at most 200")
        if shutil.which("ip") is None:
            raise NetnsError("the `ip` command is missing: apt-get install iproute2 "
                             "(scripts/setup.sh does)")
        remove_leftovers(prefix)
        log_dir.mkdir(parents=True, exist_ok=True)
        cluster = cls(prefix, choose_subnet(os.getpid()), log_dir)
        atexit.register(cluster.close)
        try:
            cluster._build(names)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _build(self, names: Sequence[str]) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(names):
            host = Host(name, f"{self.prefix}-{name}",
                        str(self.subnet.network_address + HOST_OFFSET + i), f"{self.prefix}v{i}")
            _ip("netns", "add", host.netns)
            self.hosts[name] = host
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}",
                "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def use_log_dir(self, log_dir: Path) -> None:
        """Where the logs of processes spawned from now on go (one directory per test)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._labels.clear()

    # ---------------------------------------------------------------- processes
    def spawn(self, host: str, argv: Sequence[str], *, label: str | None = None,
              lifetime: float = 120.0, env: dict[str, str] | None = None) -> HostProcess:
        """Start ``argv`` inside ``host``'s namespace; killed after ``lifetime`` s."""
        if self._closed:
            raise NetnsError("the cluster is torn down")
        base = label or f"{host}-{Path(argv[0]).name}"
        n = self._labels[base] = self._labels.get(base, 0) + 1
        proc = HostProcess(self.hosts[host], base if n == 1 else f"{base}.{n}", argv,
                           self.log_dir, lifetime, env)
        self._processes.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], *, timeout: float = 60.0,
            label: str | None = None) -> tuple[int, HostProcess]:
        """``spawn`` and wait (failing after ``timeout`` s); (exit code, the process)."""
        proc = self.spawn(host, argv, label=label, lifetime=timeout + 5)
        return proc.wait(timeout), proc

    def stop_processes(self) -> None:
        """Stop every process spawned so far (SIGTERM, then SIGKILL)."""
        processes, self._processes = self._processes, []
        for proc in processes:
            if proc.popen.poll() is None:
                proc.kill(signal.SIGTERM)
        for proc in processes:
            proc.stop(grace=5.0)

    def check_reachability(self, timeout: float = 5.0) -> None:
        """Every host reaches the bridge address (a TCP connection to a listener
        here) and its neighbour host (a connection refused by its kernel, not
        dropped). Raises ``NetnsError`` naming what failed — e.g. a firewall
        filtering bridged traffic (br_netfilter with a FORWARD DROP policy)."""
        names = list(self.hosts)
        with socket.socket() as listener:
            listener.bind((self.bridge_address, 0))
            listener.listen(len(names) + 1)
            port = listener.getsockname()[1]
            probes = []
            for i, name in enumerate(names):
                neighbour = self.hosts[names[(i + 1) % len(names)]].address
                script = (
                    "import socket, sys\n"
                    f"socket.create_connection(({self.bridge_address!r}, {port}), {timeout}).close()\n"
                    "try:\n"
                    f"    socket.create_connection(({neighbour!r}, 9), {timeout})\n"
                    "except ConnectionRefusedError:\n"
                    "    sys.exit(0)\n"
                    "sys.exit(3)\n"
                )
                probes.append(self.spawn(name, [sys.executable, "-c", script],
                                         label=f"{name}-probe", lifetime=timeout * 3))
            failed = []
            for proc in probes:
                try:
                    code = proc.popen.wait(timeout * 3)
                except subprocess.TimeoutExpired:
                    code = -1
                if code != 0:
                    failed.append(proc.describe())
        if failed:
            raise NetnsError("test hosts cannot reach each other or the bridge (a firewall "
                             "filtering bridged traffic?):\n" + "\n".join(failed))

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        """Kill every process, delete namespaces, veths and bridge. Idempotent;
        never raises for what is already gone."""
        if self._closed:
            return
        self._closed = True
        for proc in self._processes:
            proc.kill()
        for proc in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)
            proc._timer.cancel()
        for host in self.hosts.values():
            _kill_namespace_pids(host.netns)
            _ip("netns", "delete", host.netns, check=False)
            _ip("link", "delete", host.veth, check=False)
        _ip("link", "delete", self.bridge, check=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
