# SPDX-License-Identifier: MIT
"""A real single-node Ceph cluster (one monitor, one memstore OSD, all on
127.0.0.1) shared by every pytest worker of a run.

Its ports are fixed (3300/6789), so one cluster serves the whole machine:
the first user starts it under ROOT, later users join, the last one stops
it. Users are the PIDs in ROOT/users, edited under an flock on LOCK; a user
that died without leaving is pruned, so a crashed run never blocks the
next one (a cluster nobody alive uses is stopped and started afresh).
Daemons are stopped by the PIDs of their pid files, SIGTERM then SIGKILL.

    python3 tests/interop/ceph_cluster.py start|release|stop   (by hand;
    start and release join and leave as the calling shell, stop ends it
    whoever uses it)
"""
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

ROOT = "/tmp/blkimg-rbd-cluster"
LOCK = "/tmp/blkimg-rbd-cluster.lock"
CONF = os.path.join(ROOT, "ceph.conf")
POOL = "rbd"
PACKAGES = ("ceph-mon", "ceph-osd", "rbd", "rados", "ceph")


def available():
    return all(shutil.which(p) for p in PACKAGES)


def _env():
    env = dict(os.environ)
    env["CEPH_CONF"] = CONF
    return env


def _run(*cmd, timeout=60):
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s%s" % (
            " ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r.stdout


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _conf_text(fsid):
    return """[global]
fsid = %(fsid)s
mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
mon warn on pool no redundancy = false
mon data avail warn = 1
run dir = %(r)s/run
pid file = %(r)s/run/$name.pid
admin socket = %(r)s/run/$name.asok
log file = %(r)s/log/$name.log
mon data = %(r)s/mon/$name
osd data = %(r)s/osd/$name
osd objectstore = memstore
memstore device bytes = 2147483648
osd max object name len = 256
osd max object namespace len = 64
client mount timeout = 15
""" % {"fsid": fsid, "r": ROOT}


def _pids():
    d = os.path.join(ROOT, "run")
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".pid"):
            try:
                with open(os.path.join(d, name)) as f:
                    out.append(int(f.read().strip()))
            except (OSError, ValueError):
                pass
    return out


def _stop_daemons():
    pids = [p for p in _pids() if _alive(p)]
    for p in pids:
        os.kill(p, signal.SIGTERM)
    end = time.time() + 10
    while time.time() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)


def _start():
    shutil.rmtree(ROOT, ignore_errors=True)
    for d in ("run", "log", "mon/mon.a", "osd/osd.0"):
        os.makedirs(os.path.join(ROOT, d))
    fsid = str(uuid.uuid4())
    with open(CONF, "w") as f:
        f.write(_conf_text(fsid))
    keyring = os.path.join(ROOT, "mon.keyring")
    monmap = os.path.join(ROOT, "monmap")
    _run("ceph-authtool", "-C", keyring, "--gen-key", "-n", "mon.",
         "--cap", "mon", "allow *")
    _run("monmaptool", "--create", "--fsid", fsid, "--addv", "a",
         "[v2:127.0.0.1:3300,v1:127.0.0.1:6789]", monmap)
    _run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap,
         "--keyring", keyring)
    _run("ceph-mon", "-i", "a")
    _run("ceph", "--connect-timeout", "30", "mon", "stat")
    osd_uuid = str(uuid.uuid4())
    oid = _run("ceph", "osd", "new", osd_uuid).strip()
    _run("ceph-osd", "-i", oid, "--mkfs", "--osd-uuid", osd_uuid)
    _run("ceph-osd", "-i", oid)
    end = time.time() + 60
    while "osd.%s up" % oid not in _run("ceph", "osd", "dump"):
        if time.time() > end:
            raise RuntimeError("osd.%s did not come up" % oid)
        time.sleep(0.3)
    _run("ceph", "osd", "pool", "create", POOL, "8", "8")
    _run("rbd", "pool", "init", POOL)
    probe = os.path.join(ROOT, "probe")
    with open(probe, "wb") as f:
        f.write(b"probe")
    _run("rados", "-p", POOL, "put", "probe", probe, timeout=60)
    _run("rados", "-p", POOL, "rm", "probe")


def _users():
    try:
        with open(os.path.join(ROOT, "users")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _set_users(users):
    with open(os.path.join(ROOT, "users"), "w") as f:
        f.write(" ".join(str(u) for u in users))


def acquire():
    """Joins the cluster (starting it when nobody alive uses it). Returns
    the path of its ceph.conf."""
    with open(LOCK, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        users = [u for u in _users() if _alive(u) and u != os.getpid()]
        if not users or not all(_alive(p) for p in _pids() or [0]):
            _stop_daemons()
            try:
                _start()
            except Exception:
                _stop_daemons()
                raise
            users = []
        _set_users(users + [os.getpid()])
    return CONF


def release(pid=None):
    """Leaves the cluster (as pid, default this process); the last user
    stops it."""
    pid = pid or os.getpid()
    with open(LOCK, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        users = [u for u in _users() if _alive(u) and u != pid]
        if users:
            _set_users(users)
        else:
            _stop_daemons()
            shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        # a user that stays: the shell that asked (its parent)
        acquire()
        _set_users(_users()[:-1] + [os.getppid()])
        print(CONF)
    elif sys.argv[1:] == ["release"]:
        # the shell that asked leaves; the last user stops the cluster
        release(os.getppid())
    elif sys.argv[1:] == ["stop"]:
        with open(LOCK, "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            _stop_daemons()
            shutil.rmtree(ROOT, ignore_errors=True)
    else:
        sys.exit("usage: ceph_cluster.py start|release|stop")
