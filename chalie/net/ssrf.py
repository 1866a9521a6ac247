"""The SSRF guard: which addresses anything that fetches on the model's behalf may reach.

The daemon runs on a person's own machine, beside their router, their NAS and
the services they run on loopback. A URL the model (or a page, or a search
result) hands us must not become a way into any of them. So, by default, only
*public* unicast addresses are reachable; refused are loopback, private
(RFC 1918), carrier-grade NAT, link-local (and with it the cloud metadata
address 169.254.169.254), unique-local IPv6 (fd00:ec2::254, the other
metadata address, is one), multicast, reserved, unspecified and documentation
ranges, and every IPv6 form that embeds an IPv4 address (mapped, NAT64, 6to4,
Teredo) is judged by the IPv4 address inside it.

The check is made on the addresses a host name *resolves to*, not on the
name: ``intranet.example`` resolving to 10.0.0.5 is refused like 10.0.0.5.
Every address a name resolves to must pass (a name answering with one public
and one private address is refused), and the connection is then made to the
checked address itself (:meth:`Guard.connect`), so nothing can resolve the
name a second time to something else (no DNS-rebinding gap). Fetchers connect
only through :meth:`Guard.connect` (``chalie.web.http`` plugs it under the
HTTP client), so every redirect's new connection is checked too.

An operator who wants a local service reachable lists it in ``[web] allow``:
an address, a network (``192.168.1.0/24``) or a host name, optionally with a
port (``127.0.0.1:8080``, ``wiki.lan:443``); the tests use it to reach their
site on loopback. A refusal is a :class:`Blocked` with the stable code
:data:`BLOCKED_CODE` and a one-line reason that names the address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

BLOCKED_CODE: Final = "blocked-address"
SCHEMES: Final = ("http", "https")
DEFAULT_PORTS: Final = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses it resolves to; socket.getaddrinfo unless a test swaps it.
Resolver = Callable[[str, int], Sequence[str]]

# Named because ``is_global`` alone misses some of them (multicast can be "global",
# and these are spelt out so the refusal says which rule hit).
_RULES: Final[tuple[tuple[str, Callable[[IPAddress], bool]], ...]] = (
    ("unspecified", lambda ip: ip.is_unspecified),
    ("loopback", lambda ip: ip.is_loopback),
    ("link-local", lambda ip: ip.is_link_local),
    ("site-local", lambda ip: isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
    ("private", lambda ip: ip.is_private),
    ("multicast", lambda ip: ip.is_multicast),
    ("reserved", lambda ip: ip.is_reserved),
    ("not public", lambda ip: not ip.is_global),
)
_METADATA: Final = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.ip_network("64:ff9b:1::/48")


class Blocked(Exception):
    """A destination the guard refuses; ``code`` is always :data:`BLOCKED_CODE`."""

    code: Final = BLOCKED_CODE

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or ip in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    packed = int(ip)
    if packed >> 32 == 0 and packed > 1:  # the deprecated IPv4-compatible form ::a.b.c.d
        return ipaddress.IPv4Address(packed)
    return None


def why_not_public(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public unicast address (None: it is)."""
    if ip in _METADATA:
        return "a cloud metadata address"
    inner = embedded_ipv4(ip)
    if inner is not None:
        reason = why_not_public(inner)
        return None if reason is None else f"{reason} (inside {ip})"
    for name, rule in _RULES:
        if rule(ip):
            return name
    return None


@dataclass(frozen=True)
class AllowEntry:
    """One ``[web] allow`` entry: a network or a host name, and maybe one port."""

    network: IPNetwork | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> AllowEntry:
        raw = text.strip()
        if not raw or len(raw) > 300 or any(c.isspace() for c in raw):
            raise ValueError(f"web.allow entry {text!r} is empty or has spaces")
        port: int | None = None
        host = raw
        if raw.startswith("["):  # [::1]:8080 or [::1]
            end = raw.find("]")
            if end < 0:
                raise ValueError(f"web.allow entry {text!r}: unclosed [")
            host, rest = raw[1:end], raw[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"web.allow entry {text!r}: junk after ]")
                port = _port(rest[1:], text)
        elif raw.count(":") == 1:
            host, _, port_text = raw.partition(":")
            port = _port(port_text, text)
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            name = host.lower().rstrip(".")
            if not name or not all(part and len(part) <= 63 for part in name.split(".")):
                raise ValueError(
                    f"web.allow entry {text!r} is not an address, network or host"
                ) from None
            return cls(host=name, port=port)
        return cls(network=network, port=port)

    def admits(self, host: str, ip: IPAddress, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return ip.version == self.network.version and ip in self.network
        return self.host == host.lower().rstrip(".")


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"web.allow entry {entry!r}: port {text!r} is not 1-65535")
    return int(text)


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system's resolver, TCP)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    """A checked destination: the name asked for and the address to connect to."""

    host: str
    port: int
    address: str


@dataclass(frozen=True)
class Guard:
    """The policy, immutable: share one across threads."""

    allow: tuple[AllowEntry, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def from_config(cls, allow: Iterable[str], resolver: Resolver | None = None) -> Guard:
        entries = tuple(AllowEntry.parse(a) for a in allow)
        return cls(entries, resolver or system_resolver)

    def check_url(self, url: str) -> tuple[str, int]:
        """The URL's (host, port) if its form is fetchable; Blocked otherwise (no DNS yet)."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise Blocked(f"not a usable URL: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise Blocked(f"scheme {scheme or '(none)'!r} is not fetched; only http and https")
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise Blocked("the URL has no host")
        if parts.username is not None or parts.password is not None:
            raise Blocked("URLs with credentials in them are not fetched")
        return host, port or DEFAULT_PORTS[scheme]

    def check_address(self, host: str, address: str, port: int) -> IPAddress:
        """The address if the guard lets ``host`` reach it on ``port``; Blocked otherwise."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            raise Blocked(f"{host} resolved to something that is not an address") from None
        if any(entry.admits(host, ip, port) for entry in self.allow):
            return ip
        reason = why_not_public(ip)
        if reason is not None:
            named = host if host == str(ip) else f"{host} ({ip})"
            raise Blocked(
                f"{named} is {reason}: not reachable from here "
                "(an operator can list it in [web] allow)"
            )
        return ip

    def resolve(self, host: str, port: int) -> Target:
        """Resolve ``host`` and check *every* address; the first is the one to connect to."""
        literal = _literal(host)
        if literal is not None:
            addresses: Sequence[str] = [literal]
        else:
            addresses = self.resolver(host, port)
            if not addresses:
                raise OSError(f"cannot resolve {host}: no addresses")
        checked = [self.check_address(host, a, port) for a in addresses]
        return Target(host, port, str(checked[0]))

    def check(self, url: str) -> Target:
        """The whole check for one URL: form, resolution, every address."""
        host, port = self.check_url(url)
        return self.resolve(host, port)

    def connect(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """A TCP connection to the checked address of ``host`` (never a second lookup)."""
        target = self.resolve(host, port)
        return socket.create_connection(
            (target.address, port), timeout, source_address=source_address
        )


def _literal(host: str) -> str | None:
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare.split("%", 1)[0]))
    except ValueError:
        pass
    # Forms the C resolver reads as IPv4 although they are not dotted quads:
    # 2130706433, 0x7f.1, 0177.0.0.1 all mean 127.0.0.1.
    try:
        return socket.inet_ntoa(socket.inet_aton(bare))
    except OSError:
        return None
