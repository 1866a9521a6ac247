"""The SSRF guard: non-public addresses refused after resolution; the checked address is used."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest

from chalie.net.ssrf import BLOCKED_CODE, AllowEntry, Blocked, Guard, why_not_public

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "0.0.0.0",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",  # carrier-grade NAT
    "169.254.169.254",  # cloud metadata
    "169.254.1.1",
    "224.0.0.1",
    "240.0.0.1",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "::1",
    "::",
    "fe80::1",
    "fec0::1",  # the deprecated site-local range
    "fc00::1",
    "fd00:ec2::254",  # the other metadata address
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2001:db8::1",  # documentation
]
PUBLIC = ["1.1.1.1", "93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert why_not_public(ipaddress.ip_address(address)) is not None
    with pytest.raises(Blocked) as caught:
        Guard().check(f"http://[{address}]/" if ":" in address else f"http://{address}/")
    assert caught.value.code == BLOCKED_CODE == "blocked-address"
    assert "[web] allow" in caught.value.reason


def test_metadata_is_named_as_such() -> None:
    assert why_not_public(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"
    assert why_not_public(ipaddress.ip_address("fd00:ec2::254")) == "a cloud metadata address"


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert why_not_public(ipaddress.ip_address(address)) is None
    host = f"[{address}]" if ":" in address else address
    assert Guard().check(f"https://{host}/x").address == str(ipaddress.ip_address(address))


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "0177.0.0.1", "127.1"])
def test_odd_ipv4_spellings_are_read_as_the_resolver_reads_them(host: str) -> None:
    with pytest.raises(Blocked, match="loopback"):
        Guard(resolver=lambda h, p: pytest.fail("a literal is not resolved")).check(
            f"http://{host}/"
        )


def test_a_public_looking_name_resolving_to_a_private_address_is_refused() -> None:
    guard = Guard(resolver=lambda host, port: ["10.0.0.7"])
    with pytest.raises(Blocked, match=r"news\.example\.com \(10\.0\.0\.7\) is private"):
        guard.check("https://news.example.com/story")


def test_one_private_address_among_public_ones_refuses_the_name() -> None:
    guard = Guard(resolver=lambda host, port: ["93.184.215.14", "127.0.0.1"])
    with pytest.raises(Blocked, match="loopback"):
        guard.check("http://mixed.example/")


def test_the_real_resolver_is_checked_too() -> None:
    with pytest.raises(Blocked, match="localhost"):
        Guard().check("http://localhost:8461/")


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://x/",
        "ftp://example.com/",
        "http:///nohost",
        "//x/",
        "http://u:p@example.com/",
    ],
)
def test_only_plain_http_urls_are_fetched(url: str) -> None:
    with pytest.raises(Blocked):
        Guard(resolver=lambda h, p: ["93.184.215.14"]).check(url)


def test_the_allow_list_admits_networks_hosts_and_ports() -> None:
    guard = Guard.from_config(
        ["127.0.0.1:8080", "192.168.1.0/24", "wiki.lan", "[::1]:9000"],
        resolver=lambda host, port: {"wiki.lan": ["10.9.9.9"], "nas.lan": ["192.168.1.20"]}.get(
            host, ["10.0.0.1"]
        ),
    )
    assert guard.check("http://127.0.0.1:8080/").address == "127.0.0.1"
    with pytest.raises(Blocked):
        guard.check("http://127.0.0.1:8081/")  # another port on loopback
    assert guard.check("http://nas.lan/").address == "192.168.1.20"
    assert guard.check("https://wiki.lan/").address == "10.9.9.9"
    assert guard.check("http://[::1]:9000/").address == "::1"
    with pytest.raises(Blocked):
        guard.check("http://other.lan/")


@pytest.mark.parametrize("entry", ["", "a b", "[::1", "127.0.0.1:0", "host:99999", "x..y"])
def test_bad_allow_entries_are_config_errors(entry: str) -> None:
    with pytest.raises(ValueError):
        AllowEntry.parse(entry)


def test_connect_uses_the_checked_address_and_resolves_once() -> None:
    """A rebinding resolver answers public then private: the connection goes where was checked."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[str] = []

    def accept() -> None:
        conn, peer = server.accept()
        accepted.append(peer[0])
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    answers = [["127.0.0.1"], ["10.0.0.1"]]
    calls: list[str] = []

    def rebinding(host: str, p: int) -> list[str]:
        calls.append(host)
        return answers[len(calls) - 1]

    guard = Guard.from_config([f"127.0.0.1:{port}"], resolver=rebinding)
    sock = guard.connect("rebind.example", port, timeout=5)
    sock.close()
    thread.join(5)
    server.close()
    assert calls == ["rebind.example"]
    assert accepted == ["127.0.0.1"]
    with pytest.raises(Blocked, match=r"10\.0\.0\.1"):
        guard.connect("rebind.example", port, timeout=5)  # the second answer is checked anew


def test_the_allow_list_is_read_from_config_and_checked_at_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from chalie.process.config import Config, ConfigError

    config = Config.from_mapping({"web": {"allow": ["127.0.0.1:8080"]}}, home=tmp_path)
    guard = Guard.from_config(config.web.allow)
    assert guard.check("http://127.0.0.1:8080/").address == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"web\.allow entry 'x y'"):
        Config.from_mapping({"web": {"allow": ["x y"]}}, home=tmp_path)
