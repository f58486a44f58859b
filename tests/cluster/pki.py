"""A throw-away PKI for the local control plane, made with `cryptography` (no openssl needed).

One CA signs the API server's serving certificate, the admin client certificate (group
system:masters, used by every component and by the tests) and any webhook serving certificate a
test needs; the apiserver dials webhooks at https://127.0.0.1:<port>, so those need an IP SAN.
ECDSA P-256 keys keep generation fast on 2 cores; the service-account key is RSA because that is
what every token consumer accepts.

A second CA, the front proxy's, signs the client certificate the API server presents to aggregated
APIs. Without it the API server publishes no requestheader-client-ca-file in kube-system's
extension-apiserver-authentication ConfigMap, and the controller manager and scheduler log
`missing content for CA bundle` every minute, a line that reads like an error in a failed run's log.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=3650)
SERVER_SANS = (
    "127.0.0.1",
    "10.96.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
)

FRONT_PROXY_CLIENT = "front-proxy-client"
"""The front proxy's client certificate's CN, the one name --requestheader-allowed-names allows."""

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Pki:
    """Paths of the files `up` creates under <state>/pki."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_crt(self) -> Path:
        return self.dir / "serving.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "serving.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def front_proxy_ca_crt(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_client_crt(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _write_key(key: PrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _san(names: tuple[str, ...]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def _sign(
    subject: x509.Name,
    key: PrivateKey,
    ca_name: x509.Name,
    ca_key: PrivateKey,
    *,
    is_ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: tuple[str, ...] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    if usage is not None:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        b = b.add_extension(_san(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256())


def _load_ca(pki: Pki) -> tuple[x509.Certificate, PrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    return cert, key


def create(directory: Path) -> Pki:
    """Create the CAs, serving, admin, front-proxy and service-account keys under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("asyncgrpo-local-ca")
    _write_cert(_sign(ca_name, ca_key, ca_name, ca_key, is_ca=True), pki.ca_crt)
    _write_key(ca_key, pki.ca_key)
    issue(pki, "serving", cn="kube-apiserver", usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=SERVER_SANS)
    issue(pki, "admin", cn="admin", org="system:masters", usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    proxy_ca_key = ec.generate_private_key(ec.SECP256R1())
    proxy_ca_name = _name("asyncgrpo-local-front-proxy-ca")
    _write_cert(
        _sign(proxy_ca_name, proxy_ca_key, proxy_ca_name, proxy_ca_key, is_ca=True), pki.front_proxy_ca_crt
    )
    proxy_key = ec.generate_private_key(ec.SECP256R1())
    proxy_cert = _sign(
        _name(FRONT_PROXY_CLIENT),
        proxy_key,
        proxy_ca_name,
        proxy_ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write_cert(proxy_cert, pki.front_proxy_client_crt)
    _write_key(proxy_key, pki.front_proxy_client_key)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(sa, pki.sa_key)
    pki.sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue(
    pki: Pki,
    name: str,
    *,
    cn: str,
    org: str | None = None,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
    sans: tuple[str, ...] = (),
) -> tuple[Path, Path]:
    """Issue <name>.crt/<name>.key signed by the cluster CA, e.g. for a webhook on 127.0.0.1."""
    ca_cert, ca_key = _load_ca(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    crt_path, key_path = pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
    _write_cert(_sign(_name(cn, org), key, ca_cert.subject, ca_key, usage=usage, sans=sans), crt_path)
    _write_key(key, key_path)
    return crt_path, key_path
