# Sourced by the device scripts: what carrying packages to the GPU machine has in common.
#
# A command there takes 64 MiB of working tree, and git-ignored paths named in `carry` stay on the
# machine while it is warm (30 s idle), so files travel in parts, one folder of at most 56 MiB per
# command, back to back; a machine released between calls starts bare (begin again at part 0).

# pip's platform tags for CPython 3.12 wheels the GPU machine (glibc 2.35+, x86-64) can install.
PLATFORMS=(--python-version 3.12 --implementation cp --only-binary=:all: --platform any --platform manylinux2014_x86_64)
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do PLATFORMS+=(--platform "manylinux_${n}_x86_64"); done

exclude_device_dir() {
  grep -qx '/.device/' .gitignore 2>/dev/null || grep -qx '/.device/' .git/info/exclude 2>/dev/null ||
    echo '/.device/' >>.git/info/exclude
}

# split_parts PARTS SCRIPT FILE... : FILEs, whole or cut into 56 MiB pieces, packed into PARTS/p0,
# p1, … (each at most 56 MiB) with their SHA-256 in p0/SHA256SUMS; prints the device calls (SCRIPT's
# `receive N`) that carry them.
split_parts() {
  local parts=$1 script=$2
  shift 2
  rm -rf "$parts" && mkdir -p "$parts/p0"
  (cd "$(dirname "$1")" && sha256sum "${@##*/}") >"$parts/p0/SHA256SUMS"
  local n=0 size piece
  local limit=$((56 * 2 ** 20)) cut="$parts/.cut"
  mkdir -p "$cut"
  for f in "$@"; do
    if [ "$(stat -c %s "$f")" -gt "$limit" ]; then
      split -b 56m -d -a 1 "$f" "$cut/$(basename "$f").part"
    else
      cp "$f" "$cut/"
    fi
  done
  local used=() i
  for piece in $(ls -S "$cut"); do  # first fit, largest first: few, full parts
    size=$(stat -c %s "$cut/$piece")
    for ((i = 0; ; i++)); do
      if [ $((${used[i]:-0} + size)) -le "$limit" ] || [ "${used[i]:-0}" -eq 0 ]; then break; fi
    done
    mkdir -p "$parts/p$i" && mv "$cut/$piece" "$parts/p$i/"
    used[i]=$((${used[i]:-0} + size))
    [ "$i" -gt "$n" ] && n=$i
  done
  rmdir "$cut"
  du -sh "$parts"/p*
  echo
  echo "Device calls, back to back (each within 30 s of the last):"
  for ((i = 0; i <= n; i++)); do
    echo "  run  carry=[\"$parts/p$i\"]  command: bash $script receive $i"
  done
}

# receive_part PARTS RECEIVED N : part N into RECEIVED (on the GPU machine).
receive_part() {
  mkdir -p "$2"
  cp "$1/p$3"/* "$2/"
  ls "$2" | wc -l
}

# join_checked RECEIVED : every carried file whole again in RECEIVED/whole, each checked against
# the SHA-256 taken where it was prepared.
join_checked() {
  mkdir -p "$1/whole"
  local name
  while read -r _ name; do
    if [ -f "$1/$name" ]; then mv "$1/$name" "$1/whole/"; else cat "$1/$name".part* >"$1/whole/$name"; fi
  done <"$1/SHA256SUMS"
  (cd "$1/whole" && sha256sum -c --quiet ../SHA256SUMS)
}

# entry_point SITE GROUP : weightcache's entry point of GROUP, as pyproject.toml declares it, in a
# metadata-only distribution in SITE (the code comes from the checkout on PYTHONPATH), so the engine
# finds the plug-in as it would in an image.
entry_point() {
  local info="$1/weightcache-0.0.0.dist-info" target
  target=$(python3 -c 'import sys, tomllib
print(tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"][sys.argv[1]]["weightcache"])' "$2")
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: weightcache\nVersion: 0.0.0\n' >"$info/METADATA"
  printf '[%s]\nweightcache = %s\n' "$2" "$target" >"$info/entry_points.txt"
}

# device_main ARG… : the verbs of a device script, which defines PARTS, RECEIVED, prepare, install
# and bench before it calls this.
device_main() {
  case "${1:-}" in
    prepare) prepare ;;
    receive) receive_part "$PARTS" "$RECEIVED" "$2" ;;
    install) install ;;
    bench) shift; bench "$@" ;;
    *) echo "usage: $0 prepare | receive N | install | bench SCENARIO [ARGS]" >&2; exit 2 ;;
  esac
}
