#!/usr/bin/env bash
# The transformers integration tests again on the newest transformers the "transformers" extra
# admits, installed into a throwaway directory put first on PYTHONPATH; the installed (pinned,
# oldest admitted) transformers is left alone. Requirements of the new release that the
# environment does not satisfy (e.g. a newer huggingface-hub) go into the same directory, one
# round at a time until none is missing. A release that cannot be installed, a wrong version on
# the path, or a failing test fails the script; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python3}"
spec="$("$PY" - <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement

reqs = [Requirement(r) for r in requires("attn-dispatch") or ()]
(spec,) = [
    str(r).split(";")[0].strip()
    for r in reqs
    if r.name == "transformers" and r.marker is not None and r.marker.evaluate({"extra": "transformers"})
]
print(spec)
EOF
)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
pip_target() {
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target "$dir" "$@"
}
pip_target "$spec"
export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
for round in 1 2 3 4 5; do
  # Requirements of what is in $dir that nothing on the path satisfies. kernels (hub kernels)
  # is left out: transformers imports it only when a hub kernel is requested, which no test does.
  missing="$("$PY" - "$dir" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, distributions, version
from packaging.requirements import Requirement

optional = {"kernels"}
missing = []
for dist in distributions(path=[sys.argv[1]]):
    for text in dist.requires or ():
        req = Requirement(text)
        if req.name in optional or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            ok = req.specifier.contains(version(req.name), prereleases=True)
        except PackageNotFoundError:
            ok = False
        if not ok and str(req) not in missing:
            missing.append(str(req).split(";")[0].strip())
print("\n".join(missing))
EOF
)"
  [ -z "$missing" ] && break
  [ "$round" = 5 ] && { echo "transformers newest: requirements still missing: $missing" >&2; exit 1; }
  mapfile -t reqs <<<"$missing"
  pip_target "${reqs[@]}"
done
newest="$("$PY" - "$dir" "$spec" <<'EOF'
import sys
import transformers
from packaging.requirements import Requirement

where, spec = sys.argv[1], Requirement(sys.argv[2])
assert transformers.__file__.startswith(where), f"transformers imported from {transformers.__file__}"
assert spec.specifier.contains(transformers.__version__), (transformers.__version__, str(spec))
print(transformers.__version__)
EOF
)"
echo "integrations: tests/integrations on transformers $newest (newest admitted by '$spec')"
"$PY" -m pytest -q -p no:cacheprovider tests/integrations
