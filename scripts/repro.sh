#!/usr/bin/env bash
# The full `difftx repro` run behind docs/REPRO.md: installs what it needs (Debian's `fortunes`
# corpus for the language-modelling part), builds difftx and runs the full plan into
# runs/repro (about 30 minutes on 2 idle cores; docs/REPRO.md took 1587 s), then copies the report and its plots to docs/.
#   scripts/repro.sh            # full run
#   OUT=/tmp/r scripts/repro.sh --quick   # any extra arguments go to `difftx repro`
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d /usr/share/games/fortunes ]; then
  echo "installing Debian's fortunes corpus (apt-get install fortunes)" >&2
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq fortunes >/dev/null
fi
cargo build --release --locked
OUT=${OUT:-runs/repro}
target/release/difftx --threads 2 repro --corpus /usr/share/games/fortunes --out "$OUT" "$@"
if [ "$#" -eq 0 ]; then
  mkdir -p docs/repro
  cp "$OUT"/*.png docs/repro/
  # the guide above the marker stays; the report below it is replaced, its sections one
  # level down and its title dropped
  marker='<!-- Written by'
  { awk -v m="$marker" '{ print } index($0, m) == 1 { exit }' docs/REPRO.md
    echo
    tail -n +3 "$OUT/REPRO.md" | sed -e 's|](\([a-z_]*\.png\))|](repro/\1)|g' -e 's/^## /### /'
  } > docs/REPRO.md.new
  grep -q "^$marker" docs/REPRO.md.new || { echo "docs/REPRO.md lost its marker line" >&2; exit 1; }
  mv docs/REPRO.md.new docs/REPRO.md
  echo "docs/REPRO.md and docs/repro/*.png updated" >&2
fi
