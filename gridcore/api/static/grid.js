// gridcore Grid page and task-instance page: fetch the JSON (same origin) and render it.
// Every value is in an element with a stable id and/or data-* attributes (docs/grid-page.md);
// text is set with textContent only, never parsed as markup.
"use strict";

(function () {
  const body = document.body;
  const api = body.dataset.api;
  const refreshMs = 1000 * Number(body.dataset.refreshS || 10);
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(key, String(value));
    }
    for (const child of children || []) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    for (const child of children || []) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function raw(value) {
    return value === null || value === undefined ? "null" : typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  function time(t) {
    return t === null || t === undefined ? "" : new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
  }

  // A length of time, readable: "5 ms", "4.2 s", "38 s", "3 min 4 s", "2 h 5 min", "1 d 3 h".
  function duration(s) {
    if (s === null || s === undefined) return "-";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 10) return s.toFixed(1) + " s";
    const whole = Math.round(s);
    for (const [unit, size, next, nextSize] of [["d", 86400, "h", 3600], ["h", 3600, "min", 60], ["min", 60, "s", 1]]) {
      if (whole >= size) {
        const rest = Math.floor((whole % size) / nextSize);
        return Math.floor(whole / size) + " " + unit + (rest ? " " + rest + " " + next : "");
      }
    }
    return whole + " s";
  }

  // How old something is, coarse: "just now", "38 s ago", "2 min ago", "3 h ago", "2 d ago".
  function ago(s) {
    if (s < 1) return "just now";
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
      if (s >= size) return Math.floor(s / size) + " " + unit + " ago";
    }
    return Math.floor(s) + " s ago";
  }

  function bytes(n) {
    if (n === null || n === undefined) return "unlimited";
    for (const [unit, size] of [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) {
      if (n >= size) return (n / size).toFixed(1) + " " + unit;
    }
    return n + " B";
  }

  function reasons(list) {
    return el("ul", { class: "reasons" }, (list || []).map((r) => el("li", {}, [r])));
  }

  function kinds(byKind) {
    const entries = Object.entries(byKind || {});
    if (!entries.length) return ["-"];
    return entries.map(([kind, n]) => el("span", { class: "kind", "data-kind": kind, "data-value": n }, [kind + " " + n]));
  }

  // A column: [field, title, value(row), shown(row) -> text or nodes, numeric]
  function table(node, columns, rows, rowAttrs, idOf) {
    node.replaceChildren();
    node.append(el("thead", {}, [el("tr", {}, columns.map((c) => el("th", { "data-field": c[0] }, [c[1]])))]));
    const tbody = el("tbody");
    if (!rows.length) {
      tbody.append(el("tr", { "data-empty": "true" }, [el("td", { class: "empty", colspan: columns.length }, ["none"])]));
    }
    for (const row of rows) {
      const rowId = idOf ? idOf(row) : null;
      const tr = el("tr", Object.assign({ id: rowId }, rowAttrs(row)));
      for (const [field, , value, shown, numeric] of columns) {
        const v = value(row);
        const content = shown ? shown(row) : v;
        const td = el("td", {
          "data-field": field,
          "data-value": raw(v),
          id: rowId ? rowId + "-" + field : null,
          class: numeric ? "num" : null,
        });
        if (Array.isArray(content)) td.append(...content);
        else td.append(content instanceof Node ? content : document.createTextNode(content === null || content === undefined ? "" : String(content)));
        tr.append(td);
      }
      tbody.append(tr);
    }
    node.append(tbody);
  }

  const f = (name) => (row) => row[name];

  // -- the grid page ----------------------------------------------------------------------

  // A site's report: its age, and whether its figures may be read as now (docs/grid-page.md).
  function observed(s) {
    if (s.report_state === "never") return "never observed";
    return ago(s.report_age_s) + (s.report_state === "stale" ? " (stale)" : "");
  }

  // Idle and free come from the report: unknown until a site is first observed (the row
  // then holds the grid file's size, not a count anyone saw).
  const reported = (name) => (s) => (s.report_state === "never" ? "unknown" : s[name]);

  function definitions(s) {
    const items = s.definitions.map((d) => el("li", { "data-source": d.source, "data-in-use": d.in_use }, [
      `${d.source}: ${d.processors} processors, storage ${bytes(d.storage_limit)}${d.in_use ? "" : " (not in use)"}`,
    ]));
    const note = s.retired ? [el("span", { class: "retired" }, ["retired: no grid file in use defines it"])] : [];
    return [...note, el("ul", { class: "definitions" }, items)];
  }

  function renderSites(sites) {
    const columns = [
      ["name", "site", f("name")],
      ["kind", "kind", f("kind")],
      ["software", "software", (s) => (s.release || s.api_version ? "Slurm " + (s.release || "?") + " REST " + (s.api_version || "?") : s.kind)],
      ["idle", "idle", f("idle"), reported("idle"), true],
      ["total", "total", f("total"), null, true],
      ["free", "free", f("free"), reported("free"), true],
      ["claimed", "claimed", f("claimed"), null, true],
      ["claimed-by-kind", "claimed by", f("claimed_by_kind"), (s) => kinds(s.claimed_by_kind)],
      ["queued", "queued", f("queued"), null, true],
      ["queued-by-kind", "queued by", f("queued_by_kind"), (s) => kinds(s.queued_by_kind)],
      ["external-pending", "others queued", f("external_pending"), null, true],
      ["storage-used", "storage used", f("storage_used"), (s) => bytes(s.storage_used), true],
      ["storage-limit", "storage limit", f("storage_limit"), (s) => bytes(s.storage_limit), true],
      ["usable", "usable", f("usable"), (s) => (s.usable ? "yes" : "NO")],
      ["consecutive-errors", "errors", f("consecutive_errors"), null, true],
      ["health", "health", f("health")],
      ["observed-at", "observed", f("observed_at"), observed],
      ["definitions", "defined by", f("definitions"), definitions],
    ];
    const attrs = (s) => ({ "data-site": s.name, "data-usable": s.usable, "data-report": s.report_state, "data-retired": s.retired });
    table(document.getElementById("sites"), columns, sites, attrs, (s) => "site-" + s.name);
    // the exact time of each report, where the age is shown
    for (const s of sites) {
      if (s.report_state !== "never") document.getElementById("site-" + s.name + "-observed-at").setAttribute("title", time(s.observed_at) + " UTC");
    }
  }

  function koalaColumns() {
    return [
      ["job-id", "job", f("job_id"), null, true],
      ["name", "name", f("name")],
      ["priority", "priority", f("priority")],
      ["policy", "policy", f("policy")],
      ["processors", "processors", (j) => j.requested.components.reduce((a, c) => a + c.size, 0), null, true],
      ["components", "components", (j) => j.requested.components.map((c) => c.size + (c.site ? "@" + c.site : "")).join(" + ")],
      ["sites", "placed at", (j) => j.components.map((c) => c.site).join(" ")],
      ["placement-tries", "placement tries", f("placement_tries"), null, true],
      ["claim-tries", "claim tries", f("claim_tries"), null, true],
      ["jct", "next claim (JCT)", f("jct"), (j) => time(j.jct)],
      ["submitted-at", "submitted", f("submitted_at"), (j) => time(j.submitted_at)],
      ["wait-reason", "why it waits", f("wait_reason")],
    ];
  }

  function renderKoala(koala) {
    const attrs = (j) => ({ "data-job-id": j.job_id, "data-state": j.state });
    const id = (j) => "koala-job-" + j.job_id;
    table(document.getElementById("koala-placement-high"), koalaColumns(), koala.placement.high, attrs, id);
    table(document.getElementById("koala-placement-low"), koalaColumns(), koala.placement.low, attrs, id);
    table(document.getElementById("koala-staging"), koalaColumns(), koala.staging, attrs, id);
    table(document.getElementById("koala-claiming"), koalaColumns(), koala.claiming, attrs, id);
  }

  function reservationColumns() {
    return [
      ["job-id", "job", f("job_id"), null, true],
      ["name", "name", f("name")],
      ["state", "state", f("state")],
      ["processors", "processors", f("processors"), null, true],
      ["vj-size", "g", f("vj_size"), null, true],
      ["max-clusters", "M", f("max_clusters"), null, true],
      ["clusters", "pilots per cluster", f("clusters"), (r) => Object.entries(r.clusters).map(([c, n]) => c + " " + n).join(", ")],
      ["lifetime-s", "lifetime", f("lifetime_s"), (r) => duration(r.lifetime_s), true],
      ["deadline-at", "lifetime ends", f("deadline_at"), (r) => time(r.deadline_at)],
      ["message", "message", f("message")],
      ["reasons", "selection reasons", f("reasons"), (r) => [reasons(r.reasons)]],
    ];
  }

  function pilotColumns() {
    return [
      ["id", "pilot", f("id"), null, true],
      ["job-id", "job", f("job_id"), null, true],
      ["site", "site", f("site")],
      ["processors", "processors", f("processors"), null, true],
      ["state", "state", f("state")],
      ["site-job-id", "site job", f("site_job_id")],
      ["registered-at", "registered", f("registered_at"), (p) => time(p.registered_at)],
      ["heartbeat-at", "last heartbeat", f("heartbeat_at"), (p) => time(p.heartbeat_at)],
      ["message", "message", f("message")],
    ];
  }

  function renderVjm(data) {
    table(document.getElementById("reservations"), reservationColumns(), data.reservations, (r) => ({ "data-reservation-id": r.job_id, "data-state": r.state }), (r) => "reservation-" + r.job_id);
    table(document.getElementById("pilots"), pilotColumns(), data.pilots, (p) => ({ "data-pilot-id": p.id, "data-state": p.state }), (p) => "pilot-" + p.id);
  }

  function selectionColumns() {
    return [
      ["selection-id", "selection", f("selection_id"), null, true],
      ["name", "name", f("name")],
      ["stream", "stream", f("stream")],
      ["site", "site", f("site")],
      ["processors", "processors", f("processors"), null, true],
      ["protocol", "protocol", f("protocol")],
      ["outcome", "outcome", f("outcome")],
      ["state", "state", f("state")],
      ["job-id", "site job", f("job_id")],
      ["selected-at", "selected", f("selected_at"), (s) => time(s.selected_at)],
      ["started-at", "started", f("started_at"), (s) => time(s.started_at)],
      ["finished-at", "finished", f("finished_at"), (s) => time(s.finished_at)],
      ["reasons", "reasons", f("reasons"), (s) => [reasons(s.reasons)]],
    ];
  }

  function holdColumns() {
    return [
      ["holder", "holder", f("holder")],
      ["site", "site", f("site")],
      ["ledger", "ledger", f("ledger")],
      ["processors", "processors", f("processors"), null, true],
      ["storage-bytes", "bytes", f("storage_bytes"), (h) => bytes(h.storage_bytes), true],
    ];
  }

  function planSection(plan, prefix) {
    const id = prefix + plan.run_id;
    const jobs = Object.entries(plan.jobs).map(([state, n]) => el("span", { class: "kind", "data-state": state, "data-value": n }, [state + " " + n]));
    const selections = el("table", { id: id + "-selections" });
    table(selections, selectionColumns(), plan.selections, (s) => ({ "data-selection-id": s.selection_id, "data-state": s.state }), (s) => id + "-selection-" + s.selection_id);
    const volumes = el("table", { id: id + "-volumes" });
    table(volumes, holdColumns(), plan.volumes, (h) => ({ "data-holder": h.holder }), null);
    return el("section", { class: "plan", id: id, "data-run-id": plan.run_id }, [
      el("h3", {}, ["run ", el("code", { "data-field": "run-id" }, [plan.run_id])]),
      el("p", {}, [
        "sites ", el("span", { "data-field": "sites", "data-value": raw(plan.sites) }, [plan.sites.join(", ")]),
        "; jobs ", el("span", { "data-field": "jobs", "data-value": raw(plan.jobs) }, jobs.length ? jobs : ["none"]),
        "; volumes held ", el("span", { "data-field": "volume-bytes", "data-value": plan.volume_bytes }, [bytes(plan.volume_bytes)]),
      ]),
      selections,
      volumes,
    ]);
  }

  function renderDataplans(plans) {
    const node = document.getElementById("dataplans");
    node.replaceChildren(...(plans.length ? plans.map((p) => planSection(p, "dataplan-")) : [el("p", { class: "empty", "data-empty": "true" }, ["none"])]));
  }

  function renderDecisions(decisions) {
    const columns = [
      ["at", "when", f("at"), (d) => time(d.at)],
      ["kind", "decision", f("kind")],
      ["ref", "id", f("ref"), null, true],
      ["subject", "for", f("subject")],
      ["sites", "sites", f("sites"), (d) => d.sites.join(" ")],
      ["outcome", "outcome", f("outcome")],
      ["reasons", "reasons", f("reasons"), (d) => [reasons(d.reasons)]],
    ];
    table(document.getElementById("decisions"), columns, decisions, (d) => ({ "data-decision-kind": d.kind, "data-decision-ref": d.ref }), (d) => "decision-" + d.kind + "-" + d.ref);
  }

  function renderUtilization(util) {
    const W = 800, H = 200, L = 40, R = 10, T = 10, B = 24;
    const span = Math.max(util.end - util.start, 1e-9);
    const x = (t) => L + ((t - util.start) / span) * (W - L - R);
    const y = (share) => T + (1 - share) * (H - T - B);
    const plot = svg("svg", { id: "utilization-plot", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "data-start": util.start, "data-end": util.end });
    plot.append(svg("path", { class: "axis", d: `M${L} ${T} V${H - B} H${W - R}` }));
    plot.append(svg("text", { x: 2, y: y(1) + 4 }, ["100%"]), svg("text", { x: 14, y: y(0) }, ["0%"]));
    plot.append(svg("text", { x: L, y: H - 6, id: "utilization-start" }, [time(util.start)]));
    plot.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end", id: "utilization-end" }, [time(util.end)]));
    const legend = el("ul", { id: "utilization-legend" });
    Object.entries(util.sites).forEach(([name, series], i) => {
      const color = COLORS[i % COLORS.length];
      const share = (busy) => (series.total > 0 ? Math.min(busy / series.total, 1) : 0);
      let d = "";
      series.points.forEach(([t, busy], k) => {
        d += k === 0 ? `M${x(t).toFixed(1)} ${y(share(busy)).toFixed(1)}` : ` H${x(t).toFixed(1)} V${y(share(busy)).toFixed(1)}`;
      });
      const busiest = Math.max(...series.points.map((p) => p[1]));
      const last = series.points[series.points.length - 1][1];
      plot.append(svg("path", {
        id: "utilization-" + name, "data-site": name, "data-total": series.total, "data-points": series.points.length,
        "data-max-busy": busiest, "data-last-busy": last, "data-series": JSON.stringify(series.points),
        d: d, fill: "none", stroke: color, "stroke-width": 2,
      }, [svg("title", {}, [name])]));
      legend.append(el("li", { "data-site": name, "data-max-busy": busiest, "data-last-busy": last }, [
        el("span", { class: "swatch", style: "background:" + color }), `${name}: now ${last} of ${series.total}, peak ${busiest}`,
      ]));
    });
    document.getElementById("utilization").replaceChildren(plot, legend);
  }

  function renderGrid(data) {
    renderSites(data.sites);
    renderUtilization(data.utilization);
    renderKoala(data.koala);
    renderVjm(data);
    renderDataplans(data.dataplans);
    renderDecisions(data.decisions);
  }

  // -- the task-instance page -----------------------------------------------------------------

  function coallocationSection(job) {
    const id = "task-coallocation-" + job.job_id;
    const parts = el("table", { id: id + "-components" });
    table(parts, [
      ["index", "component", f("index"), null, true],
      ["size", "processors", f("size"), null, true],
      ["site", "site", f("site")],
      ["file-site", "file from", f("file_site")],
      ["state", "state", f("state")],
      ["site-job-id", "site job", f("site_job_id")],
      ["released-at", "passed barrier", f("released_at"), (c) => time(c.released_at)],
      ["message", "message", f("message")],
    ], job.components, (c) => ({ "data-component": c.index, "data-state": c.state }), (c) => id + "-component-" + c.index);
    const placement = job.placement ? job.placement.reasons : [];
    return el("section", { class: "record", id: id, "data-job-id": job.job_id, "data-state": job.state }, [
      el("h3", {}, [`job ${job.job_id}: ${job.name}`]),
      el("p", {}, [
        "state ", el("span", { "data-field": "state", "data-value": job.state }, [job.state]),
        "; policy ", el("span", { "data-field": "policy", "data-value": job.policy }, [job.policy]),
        "; epoch ", el("span", { "data-field": "epoch", "data-value": job.epoch }, [job.epoch]),
        "; waits because ", el("span", { "data-field": "wait-reason", "data-value": raw(job.wait_reason) }, [job.wait_reason || "-"]),
      ]),
      el("div", { "data-field": "placement-reasons", "data-value": raw(placement) }, [reasons(placement)]),
      parts,
    ]);
  }

  function reservationSection(res) {
    const id = "task-reservation-" + res.job_id;
    const owned = el("table", { id: id + "-pilots" });
    table(owned, [
      ["id", "pilot", f("id"), null, true],
      ["site", "site", f("site")],
      ["state", "state", f("state")],
      ["site-job-id", "site job", f("site_job_id")],
      ["t-avail-s", "T_avail", f("t_avail_s"), (p) => duration(p.t_avail_s), true],
      ["component", "rank", f("component"), null, true],
      ["message", "message", f("message")],
    ], res.pilots, (p) => ({ "data-pilot-id": p.id, "data-state": p.state }), (p) => id + "-pilot-" + p.id);
    return el("section", { class: "record", id: id, "data-reservation-id": res.job_id, "data-state": res.state }, [
      el("h3", {}, [`job ${res.job_id}: ${res.name}`]),
      el("p", {}, [
        "state ", el("span", { "data-field": "state", "data-value": res.state }, [res.state]),
        "; ", el("span", { "data-field": "processors", "data-value": res.processors }, [res.processors]),
        " processors in virtual jobs of ", el("span", { "data-field": "vj-size", "data-value": res.vj_size }, [res.vj_size]),
        "; lifetime ", el("span", { "data-field": "lifetime-s", "data-value": raw(res.lifetime_s) }, [duration(res.lifetime_s)]),
      ]),
      el("div", { "data-field": "reasons", "data-value": raw(res.reasons) }, [reasons(res.reasons)]),
      owned,
    ]);
  }

  function renderTask(data) {
    document.getElementById("task-job-name").textContent = data.task.job_name;
    const matched = document.getElementById("task-matched-by");
    matched.textContent = data.matched_by + (data.matched_by === "name" ? " (every run of the task, newest first)" : "") + (data.task_ids_error ? ` (Airflow's records unreadable: ${data.task_ids_error})` : "");
    matched.dataset.value = data.matched_by;
    table(document.getElementById("task-selections"), selectionColumns().concat([
      ["hold", "holds now", f("hold"), (s) => (s.hold ? `${s.hold.processors} processors ${s.hold.ledger}` : "-")],
    ]), data.selections, (s) => ({ "data-selection-id": s.selection_id, "data-state": s.state }), (s) => "task-selection-" + s.selection_id);
    document.getElementById("task-coallocations").replaceChildren(...data.coallocations.map(coallocationSection));
    document.getElementById("task-reservations").replaceChildren(...data.reservations.map(reservationSection));
    document.getElementById("task-dataplan").replaceChildren(...(data.dataplan ? [planSection(data.dataplan, "task-dataplan-")] : []));
    const nothing = !data.selections.length && !data.coallocations.length && !data.reservations.length && !data.dataplan;
    document.getElementById("task-empty").hidden = !nothing;
    for (const [section, shown] of [
      ["task-selections-section", data.selections.length],
      ["task-coallocations-section", data.coallocations.length],
      ["task-reservations-section", data.reservations.length],
      ["task-dataplan-section", data.dataplan],
    ]) {
      document.getElementById(section).hidden = !shown;
    }
  }

  // -- fetching -------------------------------------------------------------------------------

  function url() {
    if (body.dataset.page !== "task") return api + "/grid";
    const task = document.getElementById("task").dataset;
    const query = new URLSearchParams({ dag_id: task.dagId, task_id: task.taskId, map_index: task.mapIndex });
    if (task.runId) query.set("run_id", task.runId);
    return api + "/grid/task?" + query.toString();
  }

  async function load() {
    const status = document.getElementById("grid-status");
    try {
      const answer = await fetch(url(), { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!answer.ok) throw new Error(`${answer.status} ${answer.statusText}`);
      const data = await answer.json();
      if (body.dataset.page === "task") renderTask(data);
      else renderGrid(data);
      status.dataset.state = "ok";
      status.dataset.takenAt = data.taken_at;
      status.textContent = "state database as of " + time(data.taken_at) + " UTC";
    } catch (error) {
      status.dataset.state = "error";
      status.textContent = "could not load: " + error.message;
    }
  }

  load();
  if (refreshMs > 0) setInterval(load, refreshMs);
})();
