#!/usr/bin/env bash
# Checks commit subjects: `area: imperative summary`, at most 72 characters, and a blank line
# between the subject and a body.
#
#   scripts/check-commit-msg.sh A..B        every commit in a git range (e.g. origin/main..HEAD)
#   scripts/check-commit-msg.sh FILE        one message file, as git's commit-msg hook passes it
#
# As a hook: ln -sf ../../scripts/check-commit-msg.sh "$(git rev-parse --git-path hooks)/commit-msg"
# Exit code 0 when every subject passes; otherwise each failure is printed and the code is 1.
set -euo pipefail

MAX=72
# area: lower-case words, digits, '-', '_', '/', '.' or ','; then ": " and a summary that does not
# start with an upper-case letter (but for a name that is spelled so, from the list) or end with
# a period.
NAMES='Helm|HAProxy|KVM|PostgreSQL|PGlite|CPython|Chromium|Node|OpenAPI|MCP|HTTP|TLS|DNS|TCP|UDP|VMM|VMs?'
PATTERN="^[a-z0-9][a-z0-9_./,-]*: ([^A-Z ]|($NAMES)[ ,']).*[^.]\$"

failures=0

# check NAME SUBJECT SECOND_LINE
check() {
  local name=$1 subject=$2 second=$3 problems=()
  if [ "${#subject}" -gt "$MAX" ]; then problems+=("${#subject} characters, at most $MAX"); fi
  if ! [[ $subject =~ $PATTERN ]]; then problems+=("not 'area: imperative summary' (lower-case area, no capital after ': ', no final period)"); fi
  if [ -n "$second" ]; then problems+=("no blank line after the subject"); fi
  if [ "${#problems[@]}" -gt 0 ]; then
    failures=$((failures + 1))
    local p
    for p in "${problems[@]}"; do echo "$name: $p: $subject" >&2; done
  fi
}

if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi

if [ -f "$1" ]; then
  # A message file: git's comment lines and leading blank lines do not count.
  mapfile -t lines < <(grep -v '^#' "$1" | sed '/./,$!d')
  subject=${lines[0]:-}
  second=${lines[1]:-}
  # Merges and fixups made by git's own commands are left alone.
  case $subject in "Merge "* | "fixup! "* | "squash! "* | "Revert \""*) exit 0 ;; esac
  check "commit message" "$subject" "$second"
else
  commits=$(git rev-list --no-merges "$1")
  for commit in $commits; do
    subject=$(git log -1 --format=%s "$commit")
    second=$(git log -1 --format=%B "$commit" | sed -n 2p)
    check "$(git rev-parse --short "$commit")" "$subject" "$second"
  done
fi

if [ "$failures" -gt 0 ]; then
  echo "check-commit-msg: $failures commit message(s) to fix" >&2
  exit 1
fi
