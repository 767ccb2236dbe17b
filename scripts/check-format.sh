#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Checks that every C file in src/, include/, tests/ and bench/ is formatted
# as .clang-format says. Prints the offending files (and clang-format's
# complaints) and exits 1 if any; `make format` fixes them.
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang-format >/dev/null 2>&1; then
    echo "check-format: clang-format not found (scripts/deps.sh installs it)" >&2
    exit 1
fi

mapfile -d '' files < <(find src include tests bench examples -name '*.[ch]' \
    -type f -print0 2>/dev/null | sort -z)
if [ ${#files[@]} -eq 0 ]; then
    echo "check-format: no C files found" >&2
    exit 1
fi

bad=()
for f in "${files[@]}"; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
        bad+=("$f")
    fi
done

if [ ${#bad[@]} -ne 0 ]; then
    echo "check-format: ${#bad[@]} of ${#files[@]} C files need clang-format" \
        "(run 'make format'):"
    for f in "${bad[@]}"; do
        echo "  $f"
        clang-format --dry-run -Werror "$f" 2>&1 | head -n 6 | sed 's/^/    /'
    done
    exit 1
fi
echo "check-format: ${#files[@]} C files formatted correctly"
