"""A real Kubernetes control plane for tests: etcd + kube-apiserver on loopback.

The binaries come from ``scripts/k8s_peers.py`` (Kubernetes v1.37.2 and its etcd,
compiled once per machine from the Go module proxy into the shared peers cache).
:class:`ControlPlane` starts, in a throwaway directory:

- a throwaway CA, the API server's serving certificate (127.0.0.1), an admin client
  certificate (group ``system:masters``) and the service-account signing key pair;
- etcd on two free loopback ports (client, peer), data in the directory, no fsync;
- kube-apiserver on a free loopback port with RBAC authorisation and the admission
  plugins ``MutatingAdmissionWebhook``, ``ValidatingAdmissionWebhook`` and
  ``PodSecurity`` named explicitly (with the default ones, ``ServiceAccount`` included),
  an audit log of every pod request at the ``Request`` level;
- a kubeconfig for the admin, and :meth:`ControlPlane.kubectl` that runs the kubectl
  built alongside.

No kubelet, scheduler or controller manager: pods are admitted and stored, and stay
Pending. The service-account controller does not run either, so :meth:`namespace`
creates each test namespace's ``default`` ServiceAccount itself (the ServiceAccount
admission plugin refuses pods without it).

:meth:`stop` terminates both processes (SIGTERM, then SIGKILL after a deadline) and
waits for them: nothing is left behind. A start that fails raises
:class:`ControlPlaneError` carrying the component's own log tail.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0
"""etcd and the API server on a loaded 2-core machine: generous, a healthy start returns
as soon as /readyz answers ok."""
STOP_TIMEOUT_S = 30.0
SERVICE_CIDR = "127.100.0.0/24"
"""Addresses the API server hands to Services: loopback, so that nothing the API server
might dial for a Service (it never does here: every webhook is called by URL) leaves
the machine."""
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    resources: [{group: "", resources: ["pods"]}]
  - level: None
"""


class ControlPlaneError(RuntimeError):
    """etcd or kube-apiserver could not be built or started; the message has the log tail."""


def _k8s_peers() -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import k8s_peers
    finally:
        sys.path.pop(0)
    return k8s_peers


def binaries() -> dict[str, Path]:
    """etcd, kube-apiserver and kubectl (built on first use: minutes; see k8s_peers)."""
    try:
        found: dict[str, Path] = _k8s_peers().ensure()
    except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
        raise ControlPlaneError(f"cannot build the control plane: {exc}") from exc
    return found


def kubernetes_version() -> str:
    return str(_k8s_peers().KUBERNETES_VERSION)


# --- a throwaway PKI --------------------------------------------------------------------


@dataclass
class CertificateAuthority:
    """A self-signed CA that issues leaf certificates (EC P-256, one hour)."""

    common_name: str
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.common_name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=6))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        directory: Path,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        ips: Sequence[str] = (),
        dns: Sequence[str] = (),
        client: bool = False,
    ) -> tuple[Path, Path]:
        """A leaf certificate and key as ``<stem>.crt``/``<stem>.key``; returns the paths.

        Written key first, then certificate, each by an atomic rename, so a reader that
        watches the certificate never sees half a file.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=6))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        sans += [x509.DNSName(name) for name in dns]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        directory.mkdir(parents=True, exist_ok=True)
        crt, pkey = directory / f"{stem}.crt", directory / f"{stem}.key"
        _atomic_write(
            pkey,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        _atomic_write(crt, cert.public_bytes(serialization.Encoding.PEM))
        return crt, pkey


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    tmp.replace(path)


def _service_account_keys(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "sa.key", directory / "sa.pub"
    _atomic_write(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
    )
    _atomic_write(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return private, public


# --- processes ---------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    """The environment of the control plane's processes: no proxy, so every call the API
    server makes (webhooks on 127.0.0.1) goes straight to loopback."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]


def _terminate(proc: _Proc) -> None:
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=STOP_TIMEOUT_S)
    proc.log_file.close()


class ControlPlane:
    """etcd + kube-apiserver in ``workdir``; see the module docstring."""

    def __init__(self, workdir: Path, bins: dict[str, Path] | None = None) -> None:
        self.workdir = workdir
        self.bins = bins or binaries()
        self.pki = workdir / "pki"
        self.ca = CertificateAuthority("gym-telemetry test cluster CA")
        self.port = 0
        self.kubeconfig = workdir / "kubeconfig"
        self.audit_log = workdir / "audit.log"
        self._procs: list[_Proc] = []

    # -- lifecycle --
    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        log = self.workdir / f"{name}.log"
        log_file = log.open("wb")
        popen = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
            cwd=self.workdir,
            start_new_session=True,
        )
        proc = _Proc(name, popen, log, log_file)
        self._procs.append(proc)
        return proc

    def _wait_ready(self, proc: _Proc, ready: Any, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited {proc.popen.returncode} before {what}; "
                    f"its log ({proc.log}) ends:\n{log_tail(proc.log)}"
                )
            if ready():
                return
            time.sleep(0.5)
        raise ControlPlaneError(
            f"{proc.name} not {what} within {START_TIMEOUT_S:.0f} s; "
            f"its log ({proc.log}) ends:\n{log_tail(proc.log)}"
        )

    def _start(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        ca_file = self.pki / "ca.crt"
        ca_file.write_bytes(self.ca.pem())
        server_crt, server_key = self.ca.issue(
            self.pki,
            "apiserver",
            "kube-apiserver",
            ips=["127.0.0.1"],
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )
        admin_crt, admin_key = self.ca.issue(
            self.pki,
            "admin",
            "gym-telemetry-test-admin",
            organization="system:masters",
            client=True,
        )
        sa_key, sa_pub = _service_account_keys(self.pki)
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)

        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.bins["etcd"]),
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait_ready(etcd, lambda: _http_ok(f"{etcd_url}/health"), "healthy")

        self.port = free_port()
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # No "kubernetes" Service endpoints: they may not be loopback addresses.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--tls-cert-file={server_crt}",
                f"--tls-private-key-file={server_key}",
                f"--client-ca-file={ca_file}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                # As clusters do: privileged pods are valid, PodSecurity decides.
                "--allow-privileged=true",
                "--enable-admission-plugins="
                "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,PodSecurity",
                f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
                f"--cert-dir={self.pki / 'generated'}",
                "--v=1",
            ],
        )
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": f"https://127.0.0.1:{self.port}",
                                "certificate-authority": str(ca_file),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "admin",
                            "user": {
                                "client-certificate": str(admin_crt),
                                "client-key": str(admin_key),
                            },
                        }
                    ],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                    "current-context": "test",
                }
            )
        )
        self._wait_ready(apiserver, self._ready, "ready (/readyz)")

    def _ready(self) -> bool:
        out = self.kubectl("get", "--raw", "/readyz", check=False, timeout=30)
        return out.returncode == 0 and out.stdout.strip() == "ok"

    def alive(self) -> bool:
        return bool(self._procs) and all(p.popen.poll() is None for p in self._procs)

    def stop(self) -> None:
        """Stop the API server, then etcd; wait for each. Idempotent."""
        for proc in reversed(self._procs):
            _terminate(proc)
        self._procs.clear()

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{log_tail(p.log)}" for p in self._procs)

    # -- the API, through kubectl --
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl --kubeconfig <admin> ARGS``; raises with stderr when ``check`` fails."""
        out = subprocess.run(
            [str(self.bins["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_clean_env(),
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}"
            )
        return out

    def apply_json(self, *args: str, obj: dict[str, Any] | list[dict[str, Any]]) -> Any:
        """``kubectl ARGS -f - -o json`` with ``obj`` on stdin; the API server's answer."""
        if isinstance(obj, list):
            obj = {"apiVersion": "v1", "kind": "List", "items": obj}
        out = self.kubectl(*args, "-f", "-", "-o", "json", input=json.dumps(obj))
        return json.loads(out.stdout)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create namespace ``name`` (with ``labels``) and its ``default`` ServiceAccount."""
        self.apply_json(
            "create",
            obj={
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            },
        )
        self.apply_json(
            "create",
            obj={
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": name},
            },
        )
        return name

    def metrics(self) -> str:
        return self.kubectl("get", "--raw", "/metrics").stdout

    def audit_events(self) -> list[dict[str, Any]]:
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]


def _http_ok(url: str) -> bool:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def metric_value(text: str, metric: str, /, **labels: str) -> float:
    """The sum of the samples of ``metric`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(metric + "{") and not line.startswith(metric + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@contextmanager
def running(workdir: Path) -> Iterator[ControlPlane]:
    """A started control plane, stopped (every process waited for) on exit."""
    plane = ControlPlane(workdir)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def on_ci() -> bool:
    """CI runs set ``CI=true``: there a control plane that cannot start fails the test."""
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}
