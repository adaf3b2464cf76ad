"""scripts/download.py offline: ``fetch`` is replaced by a function that serves local bytes."""

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from fairseq_idpg.preprocessing import TASKS, get_task

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "download.py"
_spec = importlib.util.spec_from_file_location("download_cli", SCRIPT)
dl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dl)


@pytest.fixture
def serve(monkeypatch):
    """serve[url] = bytes: what the fake network answers; ``fetched`` lists the URLs asked for."""
    served, fetched = {}, []

    def fake_fetch(url, f):
        fetched.append(url)
        if url not in served:
            raise OSError(f"404 {url}")
        f.write(served[url])

    monkeypatch.setattr(dl, "fetch", fake_fetch)
    return served, fetched


def zip_bytes(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def tar_bytes(files, mode="w"):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_url_tables_cover_every_task():
    assert sorted(dl.GLUE_TASKS) == sorted("CoLA SST-2 MRPC QQP STS-B MNLI QNLI RTE WNLI".split())
    assert set(dl.GLUE_ZIPS) | {"MRPC"} == set(dl.GLUE_TASKS)
    # every task prepare_data.py knows comes from one of the two sources
    for name, spec in TASKS.items():
        assert name in dl.GLUE_TASKS if spec.files[0].endswith(".tsv") else name.lower() in dl.LMBFF_TASKS
    assert all(url.startswith("https://") for url in [*dl.GLUE_ZIPS.values(), *dl.MRPC.values(), dl.LMBFF, dl.GLOVE])
    assert set(dl.BPE) == {"encoder.json", "vocab.bpe", "dict.txt"} and all(md5 for _, md5 in dl.BPE.values())


def test_bpe_checksums_and_default_folder(tmp_path, serve, roberta_bpe, monkeypatch):
    served, _ = serve
    for name, (url, _) in dl.BPE.items():
        served[url] = (roberta_bpe / name).read_bytes()
    monkeypatch.setattr(dl, "REPO", tmp_path)
    assert dl.main(["bpe"]) == 0  # no --out: models/gpt2_bpe in the repository
    for name in dl.BPE:
        assert (tmp_path / "models" / "gpt2_bpe" / name).read_bytes() == (roberta_bpe / name).read_bytes()


def test_wrong_checksum_raises_and_leaves_no_file(tmp_path, serve):
    served, _ = serve
    url, md5 = dl.BPE["vocab.bpe"]
    served[url] = b"not the vocabulary"
    with pytest.raises(dl.DownloadError, match="md5"):
        dl.download(url, tmp_path / "vocab.bpe", md5)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .part
    assert dl.main(["bpe", "--out", str(tmp_path)]) == 1  # the CLI: an error line, exit 1


def test_existing_file_is_skipped(tmp_path, serve):
    _, fetched = serve
    (tmp_path / "f").write_bytes(b"x")
    dl.download("https://example.org/f", tmp_path / "f")
    assert fetched == []


MSR_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"


def test_mrpc_split_on_a_tiny_corpus(tmp_path):
    train = MSR_HEADER + '1\t11\t12\tA " quoted " one .\tB .\r\n0\t21\t22\tC .\tD .\r\n1\t31\t32\tE .\tF .\r\n'
    test = MSR_HEADER + "0\t41\t42\tG .\tH .\r\n1\t51\t52\tI .\tJ .\r\n"
    files = dl.split_mrpc(train, test, "21\t22\r\n99\t98\r\n")
    header = MSR_HEADER.replace("\r\n", "\n")  # the header, byte-order mark included, in both files
    assert files["dev.tsv"] == header + "0\t21\t22\tC .\tD .\n"
    assert files["train.tsv"] == header + '1\t11\t12\tA " quoted " one .\tB .\n1\t31\t32\tE .\tF .\n'
    assert files["test.tsv"] == "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t41\t42\tG .\tH .\n1\t51\t52\tI .\tJ .\n"
    # and prepare_data.py reads what it wrote
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text(files[name], encoding="utf-8")
    assert [ex.label for ex in get_task("MRPC").read(tmp_path / "train.tsv")] == ["1", "1"]


def test_glue_mrpc_lmbff_glove_roberta(tmp_path, serve):
    served, _ = serve
    served[dl.GLUE_ZIPS["QQP"]] = zip_bytes({"QQP/train.tsv": "t", "QQP/dev.tsv": "d", "__MACOSX/QQP/._x": "junk"})
    served[dl.MRPC["train"]] = (MSR_HEADER + "1\t1\t2\tA\tB\r\n0\t3\t4\tC\tD\r\n").encode("utf-8")
    served[dl.MRPC["test"]] = MSR_HEADER.encode("utf-8")
    served[dl.MRPC["dev_ids"]] = b"3\t4\n"
    csvs = {f"original/{t}/{s}.csv": f"0,{t} {s}\n".encode() for t in dl.LMBFF_TASKS for s in ("train", "test")}
    served[dl.LMBFF] = tar_bytes({**csvs, "original/SST-2/train.csv": b"0,x\n", "original/mr/README": b"x"})
    served[dl.GLOVE] = zip_bytes({"glove.6B.50d.txt": "a 1", dl.GLOVE_FILE: "the 0.1 0.2"})
    served[dl.ROBERTA["base"]] = tar_bytes({"roberta.base/model.pt": b"w", "roberta.base/dict.txt": b"d"}, "w:gz")

    assert dl.main(["glue", "--tasks", "QQP", "MRPC", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "glue" / "QQP").iterdir()) == ["dev.tsv", "train.tsv"]
    assert (tmp_path / "glue" / "MRPC" / "dev.tsv").read_text(encoding="utf-8").endswith("0\t3\t4\tC\tD\n")
    assert dl.main(["lmbff", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "lmbff").iterdir()) == sorted(dl.LMBFF_TASKS)
    assert (tmp_path / "lmbff" / "cr" / "test.csv").read_text() == "0,cr test\n"
    assert dl.main(["glove", "--out", str(tmp_path)]) == 0
    assert [p.name for p in (tmp_path / "glove").iterdir()] == [dl.GLOVE_FILE]
    assert dl.main(["roberta", "base", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "roberta.base" / "model.pt").read_bytes() == b"w"
    # nothing temporary is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glove", "glue", "lmbff", "roberta.base"]


def test_failed_folder_download_leaves_nothing(tmp_path, serve):
    assert dl.main(["roberta", "large", "--out", str(tmp_path)]) == 1  # 404: nothing served
    assert list(tmp_path.iterdir()) == []


def test_unsafe_member_is_refused(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"x/../../evil": b"x"}))
    with pytest.raises(dl.DownloadError, match="unsafe"):
        dl.extract(archive, tmp_path / "into", dl._strip_top_folder)
