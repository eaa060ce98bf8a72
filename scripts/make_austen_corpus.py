"""Rebuild the embedded default corpus (src/inftyformer/data/austen/) from its source: the six
novels of Jane Austen as Debian's package r-cran-janeaustenr ships them (public-domain texts from
Project Gutenberg, one R character vector of lines per novel, in the package's lazy-load
database). Nothing is downloaded at run time; this script only reads the package's files:

    apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb pkg
    python scripts/make_austen_corpus.py pkg/usr/lib/R/site-library/janeaustenr/data

(or point it at /usr/lib/R/site-library/janeaustenr/data where the package is installed). It
writes each novel as UTF-8 text, its lines joined by newlines, and prints the files' sha256, which
PROVENANCE.md beside the corpus lists.

The database: Rdata.rdx (gzip) is a serialized R list whose `variables` entry maps each object's
name to (offset, length) in Rdata.rdb; each entry there is a 4-byte length and a zlib stream of
one serialized object (R's XDR serialization, format 2 or 3). Only the types these files hold are
read: character, integer, logical and double vectors, lists, pairlists (attributes) and symbols.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import sys
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "inftyformer" / "data" / "austen"
# R object -> (split, file name): four novels to train on, one to validate, one to test
NOVELS = {
    "emma": ("train", "emma"),
    "mansfieldpark": ("train", "mansfield-park"),
    "prideprejudice": ("train", "pride-and-prejudice"),
    "sensesensibility": ("train", "sense-and-sensibility"),
    "northangerabbey": ("valid", "northanger-abbey"),
    "persuasion": ("test", "persuasion"),
}
NIL, SYM, LIST, CHAR, LGL, INT, REAL, STR, VEC = 254, 1, 2, 9, 10, 13, 14, 16, 19
SPECIAL = {253, 252, 251, 250, 242, 241}  # environments and markers: no content here


class Unserializer:
    """R's XDR serialization (the subset above): `read()` gives Python values; a vector with
    attributes is (value, {name: attribute})."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at, self.refs = data, 0, []
        if self.take(2) != b"X\n":
            raise ValueError("not R's XDR serialization")
        version = self.int()
        self.take(8)  # the writer's and the minimal reader's R versions
        if version == 3:
            self.take(self.int())  # the native encoding's name

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def read(self):  # noqa: ANN201 - any R value
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == NIL or kind in SPECIAL:
            return None
        if kind == 255:  # a reference to a symbol read before
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYM:
            self.refs.append(self.read())
            return self.refs[-1]
        if kind == LIST:  # a pairlist: (tag, value) cells until NIL
            cells = {}
            while kind == LIST:
                if has_attr:
                    self.read()
                tag = self.read() if has_tag else None
                cells[tag] = self.read()
                flags = self.int()
                kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
            return cells
        if kind == CHAR:
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8")
        n = self.int()
        if kind in (LGL, INT):
            value = list(struct.unpack(f">{n}i", self.take(4 * n)))
        elif kind == REAL:
            value = list(struct.unpack(f">{n}d", self.take(8 * n)))
        elif kind in (STR, VEC):
            value = [self.read() for _ in range(n)]
        else:
            raise ValueError(f"R type {kind} is not read here")
        return (value, self.read()) if has_attr else value


def read_database(folder: Path) -> dict[str, list[str | None]]:
    """{object name: character vector} of an R lazy-load database (Rdata.rdx + Rdata.rdb)."""
    index, attrs = Unserializer(gzip.decompress((folder / "Rdata.rdx").read_bytes())).read()
    spans, names = index[attrs["names"].index("variables")]
    blob = (folder / "Rdata.rdb").read_bytes()
    out = {}
    for name, (offset, length) in zip(names["names"], spans, strict=True):
        entry = blob[offset : offset + length]
        value = Unserializer(zlib.decompress(entry[4:])).read()
        out[name] = value[0] if isinstance(value, tuple) else value
    return out


def main(folder: str) -> None:
    objects = read_database(Path(folder))
    for name, (split, stem) in NOVELS.items():
        text = "\n".join(line or "" for line in objects[name]) + "\n"
        path = OUT / split / f"{stem}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{split}/{stem}.txt  {path.stat().st_size:>7} bytes  sha256 {digest}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} JANEAUSTENR_DATA_DIR")
    main(sys.argv[1])
