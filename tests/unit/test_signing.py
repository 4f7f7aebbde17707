import pytest

from labfleet.core import signing
from labfleet.core.errors import LabfleetError, RateLimited, Unauthorized


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
    # A refusal says when to come back (RFC 9110 Retry-After, whole seconds, at least one)
    assert d.retry_after(now=t + 1) == 899 and d.retry_after(now=t + 899.5) == 1
    assert "Retry-After" in d.headers() and "Retry-After" not in rl.hit("fresh", 2, now=t).headers()
    assert rl.hit("k", 2, now=t + 900).allowed  # next window
    assert rl.hit("other", 2, now=t).allowed


# ---------------------------------------------------------------- nonces (replay protection)

PATH = "/services/labfleet/api/me"


def test_nonce_is_signed_and_checked_for_form():
    ak, sk = signing.new_access_key(), signing.new_secret_key()
    now = 1_800_000_000.0
    h = signing.signed_headers(ak, sk, "GET", PATH, now=now, nonce=True)
    nonce, date = h[signing.NONCE_HEADER], h[signing.DATE_HEADER]
    sig = signing.parse_auth_header(h["Authorization"])[1]
    assert signing.nonce_problem(nonce) is None and 16 <= len(nonce) <= 128
    assert signing.check_signature(sk, "GET", PATH, date, b"", sig, now=now, nonce=nonce) is None
    # Stripped, or another nonce: the signature no longer matches.
    assert signing.check_signature(sk, "GET", PATH, date, b"", sig, now=now) == "signature does not match"
    other = signing.new_nonce()
    assert signing.check_signature(sk, "GET", PATH, date, b"", sig, now=now, nonce=other)
    # Without a nonce, headers and signature are those of before (existing callers keep working).
    plain = signing.signed_headers(ak, sk, "GET", PATH, now=now)
    assert signing.NONCE_HEADER not in plain
    assert plain["Authorization"] == signing.auth_header(ak, signing.sign(sk, "GET", PATH, date, b""))
    # A given nonce is used as it is.
    given = signing.signed_headers(ak, sk, "GET", PATH, now=now, nonce="n" * 16)
    assert given[signing.NONCE_HEADER] == "n" * 16
    # Form: 16 to 128 URL-safe characters.
    for bad in ("short", "x" * 129, "a" * 15 + "/", "a" * 16 + "\n", "a b" * 8, "é" * 16, ""):
        assert signing.nonce_problem(bad), bad
        s = signing.sign(sk, "GET", PATH, date, b"", bad)
        assert "URL-safe" in signing.check_signature(sk, "GET", PATH, date, b"", s, now=now, nonce=bad)
    for good in ("a" * 16, "A-z_0" * 25 + "abc", signing.new_nonce()):
        assert signing.nonce_problem(good) is None, good


def test_nonce_cache_refuses_a_replay_within_the_window():
    cache = signing.NonceCache()
    t = 1_800_000_000.0
    cache.use("AK1", "n" * 16, t, now=t)
    with pytest.raises(Unauthorized, match="replayed"):
        cache.use("AK1", "n" * 16, t, now=t + 60)
    # The same nonce under another key, and another nonce under the same key, are fine.
    cache.use("AK2", "n" * 16, t, now=t + 60)
    cache.use("AK1", "m" * 16, t, now=t + 60)
    # Remembered as long as the request's date is acceptable (date + 15 minutes), then forgotten.
    with pytest.raises(Unauthorized):
        cache.use("AK1", "n" * 16, t, now=t + signing.MAX_SKEW_SECONDS)
    cache.use("AK1", "x" * 16, t, now=t + signing.MAX_SKEW_SECONDS + 1)
    assert len(cache) == 1  # the three from t are gone
    # A request dated ahead of the clock is remembered until its own date + 15 minutes.
    ahead = t + 2000 + 600
    cache.use("AK1", "f" * 16, ahead, now=t + 2000)
    with pytest.raises(Unauthorized):
        cache.use("AK1", "f" * 16, ahead, now=ahead + signing.MAX_SKEW_SECONDS)


def test_nonce_cache_memory_is_bounded():
    t = 1_800_000_000.0
    cache = signing.NonceCache(max_entries=5, max_per_key=3)
    for i in range(3):
        cache.use("AK1", f"{i:016d}", t, now=t)
    with pytest.raises(RateLimited) as limited:  # one key may not take all the room
        cache.use("AK1", "z" * 16, t, now=t + 10)
    # Its oldest nonce is forgotten a signature window after its date: then it may send one more
    assert limited.value.retry_after == signing.MAX_SKEW_SECONDS - 10
    cache.use("AK2", "a" * 16, t, now=t)
    cache.use("AK3", "a" * 16, t, now=t)
    with pytest.raises(LabfleetError) as full:  # all the room taken: refused, nothing forgotten early
        cache.use("AK4", "a" * 16, t, now=t)
    assert full.value.status == 503 and len(cache) == 5
    with pytest.raises(Unauthorized):
        cache.use("AK1", f"{0:016d}", t, now=t + 1)
    # Expired nonces make room again.
    later = t + signing.MAX_SKEW_SECONDS + 1
    for i in range(3):
        cache.use("AK1", f"{i:016d}", later, now=later)
    cache.use("AK4", "a" * 16, later, now=later)
    assert len(cache) == 4
