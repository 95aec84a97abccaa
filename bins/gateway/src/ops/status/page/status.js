// slotgate status page: reads GET /admin/events (server-sent events, read through fetch()
// streaming so that the admin token can go in the Authorization header) and draws it.
//
// Safety: every name from the gateway is written with textContent or setAttribute, never parsed
// as HTML. The token lives in this page's memory only (no storage, no cookie, no URL).
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const RETRY_FIRST_MS = 1000;
  const RETRY_MAX_MS = 30000;

  const state = {
    token: null,
    tokenRequired: document.body.dataset.adminToken === "required",
    controller: null,
    retryMs: RETRY_FIRST_MS,
    retryTimer: null,
    cards: new Map(),
    series: new Map(),
    lastTick: new Map(),
    action: null,
  };

  const $ = (id) => document.getElementById(id);

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function authHeaders() {
    return state.token ? { Authorization: "Bearer " + state.token } : {};
  }

  // "401 Unauthorized: <detail>" from a problem document, or the bare status.
  async function refusalText(response) {
    let text = response.status + " " + (response.statusText || "");
    try {
      const problem = await response.json();
      if (problem.title) text = response.status + " " + problem.title;
      if (problem.detail) text += ": " + problem.detail;
    } catch (_) {
      // Not a problem document: the status line says enough.
    }
    return text.trim();
  }

  function setConnection(text, kind) {
    const node = $("connection");
    node.textContent = text;
    node.dataset.state = kind;
  }

  function askToken(error) {
    const form = $("token-form");
    form.hidden = false;
    $("token-error").textContent = error || "";
    $("token").focus();
  }

  function retryLater(why) {
    setConnection(why + "; retrying in " + Math.round(state.retryMs / 1000) + " s", "bad");
    clearTimeout(state.retryTimer);
    state.retryTimer = setTimeout(connect, state.retryMs);
    state.retryMs = Math.min(state.retryMs * 2, RETRY_MAX_MS);
  }

  async function connect() {
    clearTimeout(state.retryTimer);
    if (state.controller) state.controller.abort();
    const controller = new AbortController();
    state.controller = controller;
    setConnection("connecting…", "wait");
    let response;
    try {
      response = await fetch("/admin/events", {
        headers: Object.assign({ Accept: "text/event-stream" }, authHeaders()),
        signal: controller.signal,
        cache: "no-store",
      });
    } catch (_) {
      if (!controller.signal.aborted) retryLater("cannot reach the gateway");
      return;
    }
    if (response.status === 401) {
      const why = await refusalText(response);
      state.token = null;
      setConnection("needs the admin token", "bad");
      askToken("Refused: " + why);
      return;
    }
    if (!response.ok || !response.body) {
      retryLater("refused: " + (await refusalText(response)));
      return;
    }
    $("token-form").hidden = true;
    $("token-error").textContent = "";
    setConnection("live", "ok");
    state.retryMs = RETRY_FIRST_MS;
    await readEvents(response.body.getReader(), controller);
  }

  async function readEvents(reader, controller) {
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          onEvent(block);
        }
      }
    } catch (_) {
      // The connection broke: retried below.
    }
    if (!controller.signal.aborted) retryLater("the stream ended");
  }

  function onEvent(block) {
    let type = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (type !== "status" || data.length === 0) return;
    let doc;
    try {
      doc = JSON.parse(data.join("\n"));
    } catch (_) {
      return;
    }
    render(doc);
  }

  // === drawing ===

  function seconds(value) {
    if (value === null || value === undefined) return "—";
    if (value < 1) return Math.round(value * 1000) + " ms";
    if (value < 60) return value.toFixed(1) + " s";
    return Math.round(value / 60) + " min";
  }

  function render(doc) {
    const at = new Date().toLocaleTimeString();
    $("meta").textContent =
      "configuration generation " + doc.generation + " · one sample every " +
      doc.sample_every_ms / 1000 + " s · updated " + at;
    renderStore(doc.store);
    const refusals = new Map(doc.refusals.map((r) => [r.model, r]));
    const live = new Map(doc.live.map((l) => [l.upstream + "\u0000" + l.model, l]));
    for (const l of doc.live) addSamples(l, doc.samples_kept);

    const container = $("upstreams");
    const seen = new Set();
    for (const upstream of doc.upstreams) {
      seen.add(upstream.name);
      let card = state.cards.get(upstream.name);
      if (!card) {
        card = makeCard(upstream.name);
        state.cards.set(upstream.name, card);
      }
      place(container, card.root, seen.size - 1); // the gateway's order
      updateCard(card, upstream, live, refusals, doc.samples_kept);
    }
    for (const [name, card] of state.cards) {
      if (!seen.has(name)) {
        card.root.remove();
        state.cards.delete(name);
      }
    }
  }

  // Under [cluster]: the shared slot store and the replicas seen alive in it.
  function renderStore(store) {
    const line = $("cluster");
    line.hidden = !store;
    if (!store) return;
    const mode = store.up ? "up" : store.rejoining ? "rejoining" : "down (" + store.on_store_down + ")";
    line.dataset.state = store.up ? "up" : "down";
    line.textContent = "Shared slot store " + mode + " · " + store.replicas_seen +
      (store.replicas_seen === 1 ? " replica" : " replicas") + " seen · last round trip " +
      store.last_round_trip_ms.toFixed(2) + " ms";
    line.title = "this replica: " + store.replica + "; seen: " + store.replicas.join(", ");
  }

  // Puts `node` at `index` among `parent`'s children, moving it only when it is elsewhere: a
  // moved node loses the keyboard focus, so nodes in place are left alone.
  function place(parent, node, index) {
    const at = parent.children[index] || null;
    if (at !== node) parent.insertBefore(node, at);
  }

  function addSamples(l, kept) {
    const key = l.upstream + "\u0000" + l.model;
    let series = state.series.get(key);
    if (!series) {
      series = { inFlight: [], queued: [] };
      state.series.set(key, series);
    }
    const last = state.lastTick.get(key) || 0;
    for (const s of l.samples) {
      if (s.tick <= last) continue;
      series.inFlight.push(s.in_flight);
      series.queued.push(s.queued);
      state.lastTick.set(key, s.tick);
    }
    const extra = series.inFlight.length - kept;
    if (extra > 0) {
      series.inFlight.splice(0, extra);
      series.queued.splice(0, extra);
    }
  }

  function makeCard(name) {
    const root = el("article", "upstream");
    root.setAttribute("data-upstream", name);
    const header = el("header");
    const title = el("h2", "", name);
    const kind = el("span", "kind");
    const health = el("span", "badge health");
    health.setAttribute("data-field", "health");
    const draining = el("span", "badge draining", "⏸ draining");
    draining.setAttribute("data-field", "draining");
    const button = el("button", "drain");
    button.type = "button";
    button.setAttribute("data-action", "drain");
    button.addEventListener("click", () => openAction(name, root.dataset.draining === "true"));
    header.append(title, kind, health, draining, button);
    const facts = el("div", "facts");
    const resident = el("p");
    resident.setAttribute("data-field", "resident");
    const cap = el("p");
    const reconcile = el("div");
    reconcile.setAttribute("data-field", "reconcile");
    facts.append(resident, cap, reconcile);
    const models = el("div", "models");
    root.append(header, facts, models);
    return { root, kind, health, draining, button, resident, cap, reconcile, models, rows: new Map() };
  }

  function updateCard(card, upstream, live, refusals, kept) {
    card.root.dataset.draining = String(upstream.draining);
    card.kind.textContent = upstream.kind;
    const status = upstream.health.status;
    card.health.dataset.status = status;
    card.health.textContent =
      status === "healthy" ? "✓ healthy" : status === "unhealthy" ? "✗ unhealthy" : "? " + status;
    card.health.title = upstream.health.last_error || "";
    card.draining.hidden = !upstream.draining;
    card.button.textContent = upstream.draining ? "Undrain" : "Drain";
    const resident = upstream.residency.resident;
    card.resident.textContent =
      "Resident: " + (resident === null ? "unknown" : resident.length ? resident.join(", ") : "none");
    card.cap.hidden = !upstream.slots;
    if (upstream.slots) {
      card.cap.textContent =
        "Engine-wide cap: " + upstream.slots.in_flight + " / " + upstream.slots.parallel + " slots";
    }
    card.reconcile.replaceChildren();
    for (const model of upstream.models) {
      const line = el("p");
      if (!model.engine || model.engine.busy === null || model.engine.busy === undefined) {
        line.textContent = model.name + ": engine does not report its busy count";
      } else {
        // Both counts are from the last check, taken together (so they compare), not now.
        const checked = model.engine.last_check
          ? " at " + new Date(model.engine.last_check).toLocaleTimeString()
          : "";
        line.textContent =
          model.name + checked + ": engine busy " + model.engine.busy + " · gateway in flight " +
          model.engine.gateway_in_flight;
        if (model.engine.warning) {
          line.append(el("span", "warning", " ⚠ " + model.engine.unaccounted + " not through the gateway"));
        }
      }
      card.reconcile.append(line);
    }
    const seen = new Set();
    for (const model of upstream.models) {
      seen.add(model.name);
      let row = card.rows.get(model.name);
      if (!row) {
        row = makeRow(model.name);
        card.rows.set(model.name, row);
      }
      place(card.models, row.root, seen.size - 1);
      const key = upstream.name + "\u0000" + model.name;
      updateRow(row, model, live.get(key), refusals.get(model.name), state.series.get(key), kept);
    }
    for (const [name, row] of card.rows) {
      if (!seen.has(name)) {
        row.root.remove();
        card.rows.delete(name);
      }
    }
  }

  function figure(list, label, field) {
    const dt = el("dt", "", label);
    const dd = el("dd");
    dd.setAttribute("data-field", field);
    list.append(dt, dd);
    return dd;
  }

  function makeRow(name) {
    const root = el("section", "model");
    root.setAttribute("data-model", name);
    const title = el("h3", "", name);
    const loaded = el("span", "badge");
    title.append(loaded);
    const slots = el("div", "slots");
    slots.setAttribute("role", "img");
    const slotLine = el("p", "line");
    const inFlight = el("span", "count");
    inFlight.setAttribute("data-field", "in-flight");
    const parallel = el("span", "count");
    parallel.setAttribute("data-field", "parallel");
    const word = el("span", "state-word");
    slotLine.append(inFlight, " / ", parallel, " slots in use", word);
    const bar = el("div", "bar");
    const fill = el("div");
    bar.append(fill);
    const queueLine = el("p", "line");
    const queued = el("span", "count");
    queued.setAttribute("data-field", "queued");
    const queue = el("span", "count");
    queue.setAttribute("data-field", "queue");
    const waitingForPlace = el("span", "count");
    waitingForPlace.setAttribute("data-field", "waiting-for-place");
    queueLine.append(queued, " / ", queue, " queued", waitingForPlace);
    const shared = el("p", "line");
    shared.setAttribute("data-field", "cluster");
    shared.hidden = true;
    const figures = el("dl", "figures");
    const wait = figure(figures, "Queue wait p50 / p99", "queue-wait");
    const firstByte = figure(figures, "First byte p50 / p99", "first-byte");
    const cache = figure(figures, "Prompt tokens from cache", "cache-hit");
    const refused = figure(figures, "Refused, last minute", "refusals");
    const spark = document.createElementNS(SVG, "svg");
    spark.setAttribute("class", "spark");
    spark.setAttribute("viewBox", "0 0 300 40");
    spark.setAttribute("preserveAspectRatio", "none");
    spark.setAttribute("role", "img");
    const lineIn = document.createElementNS(SVG, "polyline");
    lineIn.setAttribute("class", "in-flight");
    const lineQueued = document.createElementNS(SVG, "polyline");
    lineQueued.setAttribute("class", "queued");
    spark.append(lineIn, lineQueued);
    root.append(title, slots, slotLine, bar, queueLine, shared, figures, spark);
    return { root, loaded, slots, inFlight, parallel, word, fill, queued, queue, waitingForPlace, shared, wait, firstByte, cache, refused, spark, lineIn, lineQueued };
  }

  const MAX_SLOT_BOXES = 64;

  function updateRow(row, model, live, refusals, series, kept) {
    // The engine's own state where it reports one (a router, Ollama), else what residency says.
    const STATES = { loaded: "● loaded", loading: "◐ loading", unloaded: "○ not loaded", sleeping: "◑ asleep", failed: "✕ load failed" };
    row.loaded.textContent = (model.state && STATES[model.state]) || (model.loaded ? "● loaded" : "○ not loaded");
    row.loaded.dataset.state = model.state || (model.loaded ? "loaded" : "unloaded");
    const slots = model.slots; // null: unlimited, or an auto count not known yet
    row.inFlight.textContent = model.in_flight;
    row.parallel.textContent = slots === null ? String(model.parallel) : slots;
    const full = slots !== null && model.in_flight >= slots;
    row.word.dataset.state = full ? "full" : "free";
    row.word.textContent = slots === null ? "" : full ? "FULL" : (slots - model.in_flight) + " free";
    const boxes = slots === null ? 0 : Math.min(slots, MAX_SLOT_BOXES);
    if (row.slots.childElementCount !== boxes) {
      row.slots.replaceChildren();
      for (let i = 0; i < boxes; i++) row.slots.append(el("span", "slot"));
    }
    Array.from(row.slots.children).forEach((box, i) => box.classList.toggle("used", i < model.in_flight));
    row.slots.setAttribute("aria-label", model.in_flight + " of " + (slots === null ? "unlimited" : slots) + " slots in use");
    row.queued.textContent = model.queued;
    row.queue.textContent = model.queue;
    row.waitingForPlace.textContent = model.waiting_for_place > 0
      ? ", " + model.waiting_for_place + " waiting for the model to load"
      : "";
    row.fill.style.width = model.queue > 0 ? Math.min(100, (100 * model.queued) / model.queue) + "%" : "0";
    // Under [cluster]: the key across every replica, as this replica last saw it.
    row.shared.hidden = !model.cluster;
    if (model.cluster) {
      const shown = (n) => (n === null || n === undefined ? "?" : n);
      row.shared.textContent = "All replicas: " + shown(model.cluster.in_flight) + " in flight · " +
        shown(model.cluster.queued) + " queued (this replica: " + model.in_flight + " in flight, " +
        model.queued + " queued)";
    }
    if (live) {
      row.wait.textContent = seconds(live.queue_wait.p50) + " / " + seconds(live.queue_wait.p99) +
        " (" + live.queue_wait.count + " in 5 min)";
      row.firstByte.textContent = live.first_byte.count
        ? seconds(live.first_byte.p50) + " / " + seconds(live.first_byte.p99)
        : "not known yet";
      const c = live.cache;
      row.cache.textContent = c && c.prompt_tokens > 0
        ? Math.round((100 * c.cached_tokens) / c.prompt_tokens) + "% of " + c.prompt_tokens + " reported"
        : "not reported yet";
    }
    if (refusals) {
      row.refused.textContent = "queue full " + refusals.queue_full + " · wait ran out " +
        refusals.queue_timeout + " (whole model)";
    }
    if (series) drawSpark(row, series, kept, slots, model.queue);
  }

  function drawSpark(row, series, kept, slots, queue) {
    const top = Math.max(1, slots || 0, queue || 0, ...series.inFlight, ...series.queued);
    const step = 300 / Math.max(1, kept - 1);
    const offset = kept - series.inFlight.length;
    const points = (values) =>
      values.map((v, i) => ((offset + i) * step).toFixed(1) + "," + (40 - (38 * v) / top - 1).toFixed(1)).join(" ");
    row.lineIn.setAttribute("points", points(series.inFlight));
    row.lineQueued.setAttribute("points", points(series.queued));
    const last = series.inFlight.length - 1;
    row.spark.setAttribute("aria-label", last >= 0
      ? "last 5 minutes: now " + series.inFlight[last] + " in flight, " + series.queued[last] + " queued"
      : "no samples yet");
  }

  // === drain and undrain ===

  function openAction(name, draining) {
    const verb = draining ? "undrain" : "drain";
    state.action = { name, verb };
    $("action-title").textContent =
      (draining ? "Take requests on " : "Stop new requests to ") + name + "?";
    $("action-confirm").textContent = draining ? "Undrain" : "Drain";
    $("action-token").value = state.token || "";
    $("action-error").textContent = "";
    $("action-form").hidden = false;
    $("action-token").focus();
  }

  async function runAction(event) {
    event.preventDefault();
    const action = state.action;
    if (!action) return;
    const token = $("action-token").value;
    const headers = token ? { Authorization: "Bearer " + token } : {};
    let response;
    try {
      response = await fetch(
        "/admin/upstreams/" + encodeURIComponent(action.name) + "/" + action.verb,
        { method: "POST", headers, cache: "no-store" },
      );
    } catch (_) {
      $("action-error").textContent = "cannot reach the gateway";
      return;
    }
    if (!response.ok) {
      $("action-error").textContent = "Refused: " + (await refusalText(response));
      return;
    }
    if (token) state.token = token;
    state.action = null;
    $("action-form").hidden = true;
    const done = $("action-done");
    done.textContent = action.name + (action.verb === "drain" ? " is draining" : " takes requests again");
    done.hidden = false;
  }

  function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      state.token = $("token").value;
      $("token").value = "";
      connect();
    });
    $("action-form").addEventListener("submit", runAction);
    $("action-cancel").addEventListener("click", () => {
      state.action = null;
      $("action-form").hidden = true;
    });
    if (state.tokenRequired && !state.token) {
      setConnection("needs the admin token", "wait");
      askToken("");
    } else {
      connect();
    }
  }

  start();
})();
