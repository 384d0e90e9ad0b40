#!/usr/bin/env bash
# One-shot initialisation, run by the `airflow-init` service (as root, user "0:0") through
# the official entrypoint, which has already waited for the metadata database.
#   1. storage directories of every site in $GRIDCORE_GRID, owned by the Airflow user
#   2. `airflow db migrate`      Airflow's metadata DB (and the FAB auth manager's tables)
#   3. `gridcore db upgrade`     gridcore's own state DB ($GRIDCORE_DB_URL, Alembic)
#   4. the admin user, only if it does not exist yet
# Every step is idempotent: re-running `docker compose up` is safe.
set -euo pipefail

uid="${AIRFLOW_UID:-50000}"
admin_user="${_AIRFLOW_WWW_USER_USERNAME:-airflow}"
admin_password="${_AIRFLOW_WWW_USER_PASSWORD:-airflow}"

# The same script initialises the native deployment of the test tier (tests/deployment):
# there the grid may be the embedded default (no GRIDCORE_GRID: local sites under
# GRIDCORE_HOME, nothing to create) and the logs live in AIRFLOW__LOGGING__BASE_LOG_FOLDER.
if [[ -n "${GRIDCORE_GRID:-}" ]]; then
    echo "gridcore init: grid $GRIDCORE_GRID"
    mapfile -t storage_dirs < <(python - "$GRIDCORE_GRID" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as fh:
    grid = tomllib.load(fh)
for site in grid.get("sites", {}).values():
    if site.get("storage_dir"):
        print(site["storage_dir"])
PY
    )
else
    echo "gridcore init: no GRIDCORE_GRID, the embedded default grid"
    storage_dirs=()
fi
for dir in "${storage_dirs[@]}"; do
    mkdir -p "$dir"
    chown "$uid:0" "$dir" "$(dirname "$dir")"
    chmod 2775 "$dir"
    echo "gridcore init: storage $dir"
done
logs_dir="${AIRFLOW__LOGGING__BASE_LOG_FOLDER:-/opt/airflow/logs}"
mkdir -p "$logs_dir"
chown -R "$uid:0" "$logs_dir"

echo "gridcore init: airflow db migrate"
airflow db migrate

echo "gridcore init: gridcore db upgrade (${GRIDCORE_DB_URL%%://*}://...)"
gridcore db upgrade

# (`users create` would also just print "already exist" for an existing user; checking
# first keeps the log honest and never touches an existing account's password.)
# Airflow may print log lines on stdout around the JSON list (one line): the first line
# that reads as a list of users is the answer (none counts as "no such user", and then
# creating an existing user only prints "already exist").
user_exists() {
    airflow users list --output json 2>/dev/null | python -c '
import json, sys

def users(line):
    try:
        found = json.loads(line)
    except ValueError:
        return None
    if isinstance(found, list) and all(isinstance(u, dict) for u in found):
        return found
    return None

listed = next((u for u in map(users, sys.stdin) if u is not None), [])
sys.exit(0 if any(u.get("username") == sys.argv[1] for u in listed) else 1)
' "$1"
}
if user_exists "$admin_user"; then
    echo "gridcore init: admin user '$admin_user' exists"
else
    echo "gridcore init: creating admin user '$admin_user'"
    # "--password=VALUE": a password that starts with "-" is still the option's value
    airflow users create --username "$admin_user" --password="$admin_password" \
        --firstname Grid --lastname Admin --email "${admin_user}@example.org" --role Admin
fi

# Commands above ran as root: give anything they left in the shared logs back to Airflow.
chown -R "$uid:0" "$logs_dir"
echo "gridcore init: done"
