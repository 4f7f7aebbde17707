from hub_ext.core import signing


def test_sign_and_check_roundtrip():
    ak, sk = signing.new_access_key(), signing.new_secret_key()
    assert len(ak) == 20 and len(sk) == 40
    now = 1_800_000_000.0
    h = signing.signed_headers(ak, sk, "POST", "/services/labfleet/api/domains", b'{"name":"x"}', now=now)
    parsed = signing.parse_auth_header(h["Authorization"])
    assert parsed[0] == ak
    date = h[signing.DATE_HEADER]
    ok = signing.check_signature(
        sk, "POST", "/services/labfleet/api/domains", date, b'{"name":"x"}', parsed[1], now=now
    )
    assert ok is None
    # tampered body, other path, other method, wrong key, too old
    args = ("POST", "/services/labfleet/api/domains", date)
    assert signing.check_signature(sk, *args, b'{"name":"y"}', parsed[1], now=now)
    assert signing.check_signature(
        sk, "POST", "/services/labfleet/api/users", date, b'{"name":"x"}', parsed[1], now=now
    )
    assert signing.check_signature(sk, "PATCH", *args[1:], b'{"name":"x"}', parsed[1], now=now)
    assert signing.check_signature("x" * 40, *args, b'{"name":"x"}', parsed[1], now=now)
    assert "minutes" in signing.check_signature(sk, *args, b'{"name":"x"}', parsed[1], now=now + 16 * 60)
    assert signing.check_signature(sk, "POST", "/p", "yesterday", b"", parsed[1], now=now)


def test_rate_limiter_windows():
    rl = signing.RateLimiter()
    t = 900.0 * 1000
    assert [rl.hit("k", 2, now=t).allowed for _ in range(3)] == [True, True, False]
    d = rl.hit("k", 2, now=t + 1)
    assert not d.allowed and d.remaining == 0 and d.reset == int(t + 900)
    assert rl.hit("k", 2, now=t + 900).allowed  # next window
    assert rl.hit("other", 2, now=t).allowed
