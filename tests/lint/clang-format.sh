#!/usr/bin/env bash
# The C and C++ sources in the layout .clang-format describes, checked with clang-format itself (Debian
# 12's clang-format 14, which scripts/install-deps installs: another release formats some constructs
# differently). Fix a finding with: clang-format -i FILE (or the whole tree, as .clang-format says).
# Sources from `git ls-files` in a clone, else every *.c/*.h/*.cpp/*.hpp under the source tree.
set -euo pipefail
src=${1:?usage: clang-format.sh SOURCE_DIR}
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -d '' files < <(git ls-files -z -- '*.c' '*.h' '*.cpp' '*.hpp')
else
  mapfile -d '' files < <(find include runtime plugin tests bench -type f \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \) -print0)
fi
[ "${#files[@]}" -gt 0 ] || { echo "clang-format.sh: no sources found under $src" >&2; exit 1; }
if ! clang-format --dry-run -Werror "${files[@]}"; then
  echo "clang-format.sh: the files above are not in .clang-format's layout; run: clang-format -i FILE" >&2
  exit 1
fi
echo "clang-format.sh: ${#files[@]} files in layout"
