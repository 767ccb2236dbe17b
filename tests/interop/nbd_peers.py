# SPDX-License-Identifier: MIT
"""NBD servers for the tests: qemu-nbd and nbdkit started on a Unix socket
in the test's directory (or TCP on 127.0.0.1 with a free port), waited for
until they accept connections, and killed by PID when the test ends, also
when it fails. TLS material is made here: a PSK file with psktool, an X.509
CA and server/client certificates with certtool (gnutls-bin)."""
import os
import shutil
import signal
import socket
import subprocess
import time

START_TIMEOUT = 15.0


def free_port():
    """A TCP port on 127.0.0.1 nobody listens on (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connectable(addr):
    fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(addr)
            return True
        except OSError:
            return False


class Peer:
    """One server process; url/uri name it for clients."""

    def __init__(self, argv, addr, export="", log=None, env=None):
        self.argv = [str(a) for a in argv]
        self.env = env
        self.addr = addr
        self.export = export
        self.log = log
        self.proc = None

    def start(self):
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        env = None
        if self.env:
            env = dict(os.environ)
            env.update(self.env)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=out, env=env)
        if self.log:
            out.close()
        deadline = time.monotonic() + START_TIMEOUT
        # qemu-nbd and nbdkit create the socket before they accept; a
        # successful connect() to a fresh server is harmless (persistent
        # servers only are started here)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %d" %
                                   (self.argv[0], self.proc.returncode))
            if isinstance(self.addr, str):
                ready = os.path.exists(self.addr)
            else:
                ready = _connectable(self.addr)
            if ready:
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("%s did not start" % self.argv[0])

    def stop(self):
        """Kills the server by PID and reaps it (idempotent)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(timeout=30)
        if isinstance(self.addr, str) and os.path.exists(self.addr):
            os.unlink(self.addr)

    @property
    def url(self):
        """The nbd+unix:// or nbd:// URL of the export."""
        if isinstance(self.addr, str):
            return "nbd+unix:///%s?socket=%s" % (self.export, self.addr)
        return "nbd://%s:%d/%s" % (self.addr[0], self.addr[1], self.export)

    def opts(self, prefix=""):
        """QEMU's --image-opts keys naming the export (file. under a
        format: prefix="file.")."""
        if isinstance(self.addr, str):
            kv = ["server.type=unix", "server.path=" + self.addr]
        else:
            kv = ["server.type=inet", "server.host=" + self.addr[0],
                  "server.port=%d" % self.addr[1]]
        if self.export:
            kv.append("export=" + self.export)
        return ",".join(prefix + x for x in kv)


class Peers:
    """Starts servers for one test; stop_all() kills every one of them."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.peers = []
        self.n = 0

    def _addr(self, tcp):
        self.n += 1
        if tcp:
            return ("127.0.0.1", free_port())
        return str(self.dir / ("nbd%d.sock" % self.n))

    def _log(self):
        return str(self.dir / ("peer%d.log" % self.n))

    def qemu_nbd(self, image, fmt="raw", export="exp", tcp=False,
                 extra=()):
        """qemu-nbd serving image persistently (-t), shared by 8."""
        addr = self._addr(tcp)
        argv = ["qemu-nbd", "-t", "-e", "8", "-f", fmt, "-x", export]
        if tcp:
            argv += ["-b", addr[0], "-p", str(addr[1])]
        else:
            argv += ["-k", addr]
        argv += list(extra) + [str(image)]
        return self._start(Peer(argv, addr, export, self._log()))

    def nbdkit(self, plugin, *args, filters=(), tcp=False, extra=(),
               env=None):
        """nbdkit in the foreground serving the default export ""."""
        addr = self._addr(tcp)
        argv = ["nbdkit", "-f", "--exit-with-parent"]
        if tcp:
            argv += ["-i", addr[0], "-p", str(addr[1])]
        else:
            argv += ["-U", addr]
        for f in filters:
            argv += ["--filter=" + f]
        argv += list(extra) + [plugin] + list(args)
        return self._start(Peer(argv, addr, "", self._log(), env))

    def blkimg_nbd(self, tool, image, export="", tcp=False, extra=(),
                   env=None):
        """blkimg-nbd (qemu-nbd's options) serving image persistently
        (-t), shared by 8; nbdkit replaces it, so its PID is nbdkit's."""
        addr = self._addr(tcp)
        argv = [tool, "-t", "-e", "8", "-x", export]
        if tcp:
            argv += ["-b", addr[0], "-p", str(addr[1])]
        else:
            argv += ["-k", addr]
        argv += list(extra) + [str(image)]
        return self._start(Peer(argv, addr, export, self._log(), env))

    def _start(self, p):
        self.peers.append(p)
        return p.start()

    def stop_all(self):
        for p in self.peers:
            p.stop()


def have(*progs):
    return all(shutil.which(p) for p in progs)


def make_psk(dirpath, user="qemu"):
    """dir/keys.psk with one key for user (psktool)."""
    os.makedirs(dirpath, exist_ok=True)
    subprocess.run(["psktool", "-u", user, "-p",
                    os.path.join(dirpath, "keys.psk")], check=True,
                   capture_output=True)
    return str(dirpath)


def _certtool(*args):
    subprocess.run(["certtool"] + list(args), check=True, capture_output=True)


def make_x509(base):
    """A CA and a server certificate for localhost/127.0.0.1 and a client
    certificate, laid out as QEMU's tls-creds-x509 wants them: returns
    (server_dir, client_dir)."""
    base = str(base)
    srv, cli = os.path.join(base, "server"), os.path.join(base, "client")
    os.makedirs(srv, exist_ok=True)
    os.makedirs(cli, exist_ok=True)
    tmpl = {
        "ca.info": "cn = blkimg test CA\nca\ncert_signing_key\n"
                   "expiration_days = 30\n",
        "server.info": "organization = blkimg\ncn = localhost\n"
                       "dns_name = localhost\nip_address = 127.0.0.1\n"
                       "tls_www_server\nencryption_key\nsigning_key\n"
                       "expiration_days = 30\n",
        "client.info": "organization = blkimg\ncn = client\ntls_www_client\n"
                       "encryption_key\nsigning_key\nexpiration_days = 30\n",
    }
    for name, text in tmpl.items():
        with open(os.path.join(base, name), "w") as f:
            f.write(text)
    j = lambda *p: os.path.join(*p)  # noqa: E731
    _certtool("--generate-privkey", "--outfile", j(base, "ca-key.pem"))
    _certtool("--generate-self-signed", "--load-privkey", j(base, "ca-key.pem"),
              "--template", j(base, "ca.info"), "--outfile",
              j(base, "ca-cert.pem"))
    for who, d in (("server", srv), ("client", cli)):
        _certtool("--generate-privkey", "--outfile", j(d, who + "-key.pem"))
        _certtool("--generate-certificate", "--load-ca-certificate",
                  j(base, "ca-cert.pem"), "--load-ca-privkey",
                  j(base, "ca-key.pem"), "--load-privkey",
                  j(d, who + "-key.pem"), "--template", j(base, who + ".info"),
                  "--outfile", j(d, who + "-cert.pem"))
        shutil.copy(j(base, "ca-cert.pem"), j(d, "ca-cert.pem"))
    return srv, cli
