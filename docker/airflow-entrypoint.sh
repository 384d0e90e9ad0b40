#!/usr/bin/env bash
# Entrypoint of the gridcore Airflow image.
#
# The Slurm test grid (compose profile `slurm`) writes one JWT per cluster to a shared
# volume, as <site>.token. gridcore's grid file names each token by environment variable
# (token = { env = "SLURM_<SITE>_TOKEN" }), so export every token file found here under
# that name, unless the variable is already set to something non-empty (a real site's
# token given through docker/.env wins). Then exec the official Airflow entrypoint, or
# GRIDCORE_NEXT_ENTRYPOINT instead (`env` runs a one-off command with these variables).
set -euo pipefail

token_dir="${GRIDCORE_TOKEN_DIR:-/opt/gridcore/tokens}"
if [[ -d "$token_dir" ]]; then
    for token_file in "$token_dir"/*.token; do
        [[ -f "$token_file" && -r "$token_file" ]] || continue
        site="$(basename "$token_file" .token)"
        var="SLURM_$(tr '[:lower:]-' '[:upper:]_' <<<"$site")_TOKEN"
        [[ "$var" =~ ^[A-Z_][A-Z0-9_]*$ ]] || continue
        [[ -z "${!var:-}" ]] || continue
        token="$(tr -d '[:space:]' <"$token_file")"
        if [[ -n "$token" ]]; then
            export "$var=$token"
        fi
    done
fi

exec "${GRIDCORE_NEXT_ENTRYPOINT:-/entrypoint}" "$@"
