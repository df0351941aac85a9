"""cachebake.install.tarstream: the strict reader agrees with tarfile on what the packer writes,
and refuses what readers disagree on."""

import io
import tarfile

import pytest

import badlayers
from badlayers import pad, raw_dir, raw_file, raw_tar, ustar_header

from cachebake.errors import CorruptArtifact, MemberRefused, UnsafeArtifact
from cachebake.install import refusals
from cachebake.install.tarstream import ChunkReader, _checksum, members


def read_all(tar: bytes, chunk: int = 700):
    """Every header and the data the reader hands over, fed in odd-sized chunks."""
    chunks = [tar[i:i + chunk] for i in range(0, len(tar), chunk)]
    it = iter(chunks)
    reader = ChunkReader(lambda: next(it, b""))
    out = []
    for h in members(reader):
        out.append((h.name, h.isdir, h.mode, b"".join(v.tobytes() for v in reader.take_views(h.size))))
    return out


def test_agrees_with_tarfile_on_the_packers_output(triton_cache):
    """The real packer's layer for a real Triton cache (long pax paths included)."""
    from cachebake.artifact.layer import LayerWriter
    from cachebake.artifact.snapshot import CacheRoot, snapshot_roots

    import zstandard

    keydir = next(p for p in sorted(triton_cache.iterdir()) if p.is_dir())
    (keydir / ("long_" * 30 + ".txt")).write_text("a name over ustar's 100 bytes: a pax path record")
    snap = snapshot_roots([CacheRoot("triton", triton_cache)])
    buf = io.BytesIO()
    LayerWriter(buf).write(snap)
    tar = zstandard.ZstdDecompressor().decompress(buf.getvalue(), max_output_size=1 << 30)
    ours = read_all(tar)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        theirs = [(m.name, m.isdir(), m.mode, t.extractfile(m).read() if m.isreg() else b"") for m in t]
    assert ours == theirs and any(len(name) > 100 for name, *_ in ours)


@pytest.mark.parametrize("tar,error", [
    (raw_tar(ustar_header("a", size=2, checksum_delta=1) + pad(b"ok")), refusals.HeaderChecksumError),
    (raw_tar(ustar_header("a", size_field=b"\xff" * 12) + pad(b"ok")), refusals.NumericFieldError),
    (raw_tar(ustar_header("a", size_field=b"00000000002\x00", mode=0o644, magic=b"ustar  \x00")), refusals.HeaderFormatError),
    (raw_tar(badlayers.pax_header({"size": "5"}) + raw_file("a", b"ok")), refusals.PaxRecordError),
    (raw_tar(badlayers.pax_header({"SCHILY.xattr.security.capability": "x"}) + raw_file("a", b"ok")),
     refusals.PaxRecordError),
    (raw_tar(ustar_header("a", type=b"2", linkname=b"/etc")), refusals.SymlinkError),
    (raw_tar(ustar_header("a", type=b"S")), refusals.SparseError),
    (raw_tar(raw_dir("d") + b"\x00" * 512 + raw_file("x", b"hidden")), UnsafeArtifact),
    (raw_dir("d") + b"\x00" * 512, CorruptArtifact),  # one zero block only
    (raw_dir("d"), CorruptArtifact),  # no end-of-archive marker
])
def test_refusals(tar, error):
    with pytest.raises(error) as e:
        read_all(tar)
    if issubclass(error, MemberRefused):
        assert isinstance(e.value, MemberRefused) and e.value.member


@pytest.mark.parametrize("block", [bytes(512), b"\xff" * 512, bytes(range(256)) * 2,
                                   bytes((i * 7919) % 256 for i in range(512))])
def test_checksum_is_the_posix_unsigned_sum(block):
    """The Adler-32 shortcut is exact up to the largest sum a block can have (all 0xff)."""
    assert _checksum(block) == sum(block) - sum(block[148:156]) + 8 * 32


def test_a_high_byte_name_passes_the_checksum_and_is_refused_for_its_name():
    """A header whose bytes sum high in both halves (the checksum's worst case) is read to
    the name check, which refuses what is not UTF-8."""
    block = ustar_header(b"\xff" * 99, size=2, prefix=b"\xfe" * 154)
    with pytest.raises(refusals.BadNameError):
        read_all(raw_tar(block + pad(b"ok")))


def test_a_link_name_after_a_nul_is_refused():
    with pytest.raises(refusals.EntryTypeError, match="link name"):
        read_all(raw_tar(ustar_header("a", size=2, linkname=b"\x00x") + pad(b"ok")))


def test_zero_padding_to_the_record_is_accepted():
    body = raw_dir("d") + raw_file("d/f", b"x" * 1000)
    assert [n for n, *_ in read_all(raw_tar(body))] == ["d", "d/f"]
    assert len(raw_tar(body)) % 10240 == 0


def test_extract_to_writes_a_good_layer_and_removes_a_refused_one(tmp_path):
    """The one-pass extractor outside an install (fold-back's base): a manifest dict is
    schema-checked, a refusal leaves no directory behind."""
    from installkit import current_fingerprint_dict

    from cachebake.artifact.oci import Artifact
    from cachebake.install import extract

    fp = current_fingerprint_dict()
    for name, extra, ok in (("good", [], True), ("bad", [badlayers.Entry("triton/K/../../x", data=b"x")], False)):
        entries = [badlayers.Entry("triton", tarfile.DIRTYPE), badlayers.Entry("triton/K", tarfile.DIRTYPE),
                   badlayers.Entry("triton/K/f", data=b"data"), *extra]
        art = Artifact(badlayers.artifact_from_entries(tmp_path / name, entries, fp))
        bake = art.select("sm_90")
        limits = extract.LayerLimits.from_manifest(bake.manifest, bake.layer_size)
        dest = tmp_path / f"{name}-out"
        with art.open_layer(bake) as stream:
            if ok:
                stats = extract.extract_to(stream, limits, dest)
                assert (dest / "triton" / "K" / "f").read_bytes() == b"data" and stats.files == 1
            else:
                with pytest.raises(refusals.TraversalError):
                    extract.extract_to(stream, limits, dest)
                assert not dest.exists()
