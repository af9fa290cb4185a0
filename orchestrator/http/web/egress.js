// A run's egress log on the chat page (issue 35): the run's `egress_log` record (stored when its
// sandbox asked the network for anything) is shown as a collapsed "network" line; opened, it
// reads GET /api/runs/{run_id}/egress (every record of the run, merged and typed) and lists
// each decision of the egress proxy: when, the method, host:port, the path (an intercepted
// request's only; a tunnel's is never seen), bytes each way, allowed or refused and why, and
// how many decisions the run's capped log left out.  Hosts, paths and reasons come from
// requests the sandbox made, so they are hostile: everything goes in through textContent,
// as in app.js.  app.js calls render() for the record.
"use strict";

window.RunEgress = (() => {
  const enc = encodeURIComponent;

  const node = window.AgentDom.node; // dom.js

  const number = (n) => (Number.isFinite(Number(n)) ? Number(n).toLocaleString("en-US") : "?");

  function clock(at) {
    const d = new Date(Number(at) * 1000);
    if (isNaN(d)) return ["", ""];
    return [d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false }), d.toISOString()];
  }

  function row(d) {
    const [time, iso] = clock(d.at);
    const allowed = d.allowed === true;
    const path = typeof d.path === "string" && d.path ? d.path : null;
    return node("tr", { className: `egress-row ${allowed ? "allowed" : "refused"}`, dataset: { allowed: String(allowed) } },
      node("td", { className: "egress-time", text: time, title: iso }),
      node("td", { className: "egress-method", text: d.method }),
      node("td", { className: "egress-host", text: `${d.host}:${d.port}` }),
      path
        ? node("td", { className: "egress-path", text: path })
        : node("td", { className: "egress-path muted", text: "—", title: "not seen: a tunnel's path stays inside it" }),
      node("td", { className: "egress-bytes", text: `↑${number(d.sent)} ↓${number(d.received)}`, title: "bytes sent / received" }),
      node("td", { className: "egress-verdict", text: allowed ? "✅ allowed" : "🚫 refused" }),
      node("td", { className: "egress-reason", text: d.reason }));
  }

  function table(log) {
    const parts = [];
    if (log.decisions.length) {
      const head = node("tr", {}, ...["time", "method", "host:port", "path", "bytes", "", "reason"].map((t) => node("th", { text: t })));
      parts.push(node("table", { className: "egress-table" }, node("thead", {}, head), node("tbody", {}, log.decisions.map(row))));
    } else {
      parts.push(node("p", { className: "muted", text: "No egress decisions." }));
    }
    const refused = log.decisions.filter((d) => d.allowed !== true).length;
    let total = `${log.decisions.length} decision${log.decisions.length === 1 ? "" : "s"}, ${refused} refused, ${number(log.bytes)} bytes in all`;
    if (log.left_out) total += `; ${number(log.left_out)} more not kept (the run's log is capped)`;
    parts.push(node("p", { className: "egress-total muted", dataset: { leftOut: String(log.left_out || 0) }, text: total }));
    return parts;
  }

  // The record `m` (an `egress_log` message): a collapsed line that reads the run's log when
  // first opened, and again when opened after a failed read.
  function render(m, api) {
    const runId = m.metadata && typeof m.metadata.run_id === "string" ? m.metadata.run_id : null;
    const body = node("div", { className: "egress-log" });
    const details = node("details", { className: "egress", dataset: { run: runId || "" } },
      node("summary", { text: m.content || "egress decisions" }), body);
    let state = "unread";
    details.addEventListener("toggle", async () => {
      if (!details.open || state !== "unread") return;
      if (!runId) {
        body.replaceChildren(node("p", { className: "muted", text: "This record names no run." }));
        return;
      }
      state = "reading";
      details.dataset.state = "reading";
      body.replaceChildren(node("p", { className: "muted", text: "Reading the run's egress log…" }));
      try {
        const log = await api("GET", `runs/${enc(runId)}/egress`);
        body.replaceChildren(...table(log));
        state = details.dataset.state = "read";
      } catch (error) {
        body.replaceChildren(node("p", { className: "egress-error", text: `Could not read the egress log: ${error.message}` }));
        state = details.dataset.state = "unread";
      }
    });
    return details;
  }

  return { render };
})();
