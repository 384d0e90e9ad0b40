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

echo "gridcore init: grid ${GRIDCORE_GRID:?GRIDCORE_GRID is not set}"
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
for dir in "${storage_dirs[@]}"; do
    mkdir -p "$dir"
    chown "$uid:0" "$dir" "$(dirname "$dir")"
    chmod 2775 "$dir"
    echo "gridcore init: storage $dir"
done
mkdir -p /opt/airflow/logs
chown -R "$uid:0" /opt/airflow/logs

echo "gridcore init: airflow db migrate"
airflow db migrate

echo "gridcore init: gridcore db upgrade (${GRIDCORE_DB_URL%%://*}://...)"
gridcore db upgrade

# (`users create` would also just print "already exist" for an existing user; checking
# first keeps the log honest and never touches an existing account's password.)
user_exists() {
    airflow users list --output json 2>/dev/null | python -c '
import json, sys
sys.exit(0 if any(u.get("username") == sys.argv[1] for u in json.load(sys.stdin)) else 1)
' "$1"
}
if user_exists "$admin_user"; then
    echo "gridcore init: admin user '$admin_user' exists"
else
    echo "gridcore init: creating admin user '$admin_user'"
    airflow users create --username "$admin_user" --password "$admin_password" \
        --firstname Grid --lastname Admin --email "${admin_user}@example.org" --role Admin
fi

# Commands above ran as root: give anything they left in the shared logs back to Airflow.
chown -R "$uid:0" /opt/airflow/logs
echo "gridcore init: done"
