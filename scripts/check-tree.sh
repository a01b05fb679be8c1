#!/usr/bin/env bash
# Fails when git tracks a build output: an executable binary (ELF, Mach-O,
# PE, a Go test binary or archive) anywhere, or a file over 4 MiB outside
# the shipped weights (checkpoints/tiny). `make lint` (and so CI) runs it.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
limit=$((4 << 20))
bad=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46 | cffaedfe | cefaedfe | feedface | feedfacf | 4d5a*)
		echo "tracked binary: $f (a build output; remove it and ignore its path)"
		bad=1
		;;
	esac
	case "$f" in checkpoints/tiny/*) continue ;; esac
	size=$(stat -c %s "$f")
	if [ "$size" -gt "$limit" ]; then
		echo "tracked file over 4 MiB: $f ($size bytes)"
		bad=1
	fi
done < <(git ls-files -z)
exit $bad
