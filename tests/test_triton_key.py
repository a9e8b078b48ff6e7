"""Triton's cache key, read from a file instead of computed from Triton's
files at each start (kernels.remembered_triton_key): a second process gets
the key without hashing, a changed Triton gets a new one, and a cache
directory that cannot hold the file costs only the hashing. Skipped where
Triton is not installed."""
import pytest

triton = pytest.importorskip("triton")
import triton.runtime.cache as triton_cache  # noqa: E402

from tts_cli import kernels  # noqa: E402


@pytest.fixture
def fresh_process(tmp_path, monkeypatch):
    """Triton as a new process finds it, with its cache under tmp_path:
    ``start()`` puts a counting key function in place of Triton's and
    returns its call count."""
    monkeypatch.setattr(kernels, "_triton_cache_dir", lambda: tmp_path / "cache")
    calls = []

    def start(key="key-of-these-files"):
        def computed():
            calls.append(key)
            return key
        monkeypatch.setattr(triton_cache, "triton_key", computed)
        calls.clear()
        return calls
    return start


def test_a_second_process_reads_the_key_and_gets_the_same_one(fresh_process):
    calls = fresh_process()
    kernels.remembered_triton_key()
    assert calls == ["key-of-these-files"] and triton_cache.triton_key() == "key-of-these-files"

    calls = fresh_process(key="hashing-again")
    kernels.remembered_triton_key()
    assert calls == [], "the second process hashed Triton's files again"
    assert triton_cache.triton_key() == "key-of-these-files"


def test_a_changed_triton_gets_its_key_computed_again(fresh_process, monkeypatch):
    fresh_process()
    kernels.remembered_triton_key()
    monkeypatch.setattr(kernels, "_triton_files_fingerprint", lambda: "another triton")
    calls = fresh_process(key="the new key")
    kernels.remembered_triton_key()
    assert calls == ["the new key"] and triton_cache.triton_key() == "the new key"


def test_the_fingerprint_follows_a_file_of_triton_changing_size(monkeypatch, tmp_path):
    package = tmp_path / "triton"
    (package / "_C").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_C" / "libtriton.so").write_bytes(b"x" * 10)
    monkeypatch.setattr(triton, "__file__", str(package / "__init__.py"))
    before = kernels._triton_files_fingerprint()
    assert kernels._triton_files_fingerprint() == before
    (package / "_C" / "libtriton.so").write_bytes(b"x" * 11)
    assert kernels._triton_files_fingerprint() != before


@pytest.mark.parametrize("kept", ["not json", '{"fingerprint": 3}', "[]"])
def test_an_unreadable_or_foreign_key_file_is_replaced(fresh_process, tmp_path, kept):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tts-batch-triton-key.json").write_text(kept)
    calls = fresh_process()
    kernels.remembered_triton_key()
    assert calls == ["key-of-these-files"] and triton_cache.triton_key() == "key-of-these-files"
    calls = fresh_process(key="hashing-again")
    kernels.remembered_triton_key()
    assert calls == []


def test_a_cache_directory_that_cannot_be_written_costs_only_the_hashing(fresh_process, monkeypatch, tmp_path):
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(kernels, "_triton_cache_dir", lambda: tmp_path / "a file" / "cache")
    calls = fresh_process()
    kernels.remembered_triton_key()
    assert calls == ["key-of-these-files"] and triton_cache.triton_key() == "key-of-these-files"
