// The operators' console: a client of the operators' API (/admin), served
// by the service itself. Everything a record carries (keys, payloads,
// headers, reasons) is put in the page as text nodes, never as markup.
'use strict';

(() => {
  const TOKEN = 'kafka-retry-console-token';
  const OPERATOR = 'kafka-retry-console-operator';
  const $ = (id) => document.getElementById(id);

  // An element with text children; attributes are never taken from records.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  const clear = (node) => { while (node.firstChild) node.removeChild(node.firstChild); };
  const when = (ms) => (ms === null || ms === undefined ? '—' : new Date(ms).toISOString().replace('T', ' ').replace('Z', ' UTC'));
  function ago(ms) {
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 120) return `${s} s ago`;
    if (s < 7200) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} days ago`;
  }
  const text = (content) => (content ? (content.text !== undefined ? content.text : `base64:${content.base64}`) : '(null)');

  function say(message, isError) {
    const status = $('status');
    status.textContent = message;
    status.className = isError ? 'status error' : 'status';
  }

  class Refused extends Error {}

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${sessionStorage.getItem(TOKEN) || ''}` };
    const operator = sessionStorage.getItem(OPERATOR);
    if (operator) headers['X-Operator'] = operator;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store', credentials: 'omit',
    });
    const raw = await response.text();
    let data;
    try { data = JSON.parse(raw); } catch (_) { data = { error: raw }; }
    if (response.status === 401) {
      logout('The service refused the token: log in again.');
      throw new Refused('unauthorized');
    }
    if (!response.ok) throw new Error(data && data.error ? data.error : `HTTP ${response.status}`);
    return data;
  }

  // --- Session -------------------------------------------------------------

  function logout(reason) {
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(OPERATOR);
    $('app').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = reason || '';
    $('token').value = '';
    $('token').focus();
  }

  async function login(event) {
    event.preventDefault();
    $('login-error').textContent = '';
    sessionStorage.setItem(TOKEN, $('token').value);
    const operator = $('operator').value.trim();
    if (operator) sessionStorage.setItem(OPERATOR, operator); else sessionStorage.removeItem(OPERATOR);
    try {
      await api('GET', '/admin/dlq');
    } catch (e) {
      if (!(e instanceof Refused)) {
        sessionStorage.removeItem(TOKEN);
        $('login-error').textContent = `Cannot reach the operators' API: ${e.message}`;
      }
      return;
    }
    $('token').value = '';
    await enter();
  }

  // --- State ---------------------------------------------------------------

  const state = {
    topic: null, // the dead-letter topic
    source: null, // the source topic: replays go there
    partitions: [],
    records: [], // the records read, in order
    next: null, // where the next page starts: {partition, offset} or {offsets}
    selected: new Map(), // "p:o" -> record
    dryRun: null, // the selection a dry run was made for
  };
  const id = (r) => `${r.partition}:${r.offset}`;

  async function enter() {
    $('login').hidden = true;
    $('app').hidden = false;
    $('logout').hidden = false;
    show('overview');
    await refreshOverview();
  }

  function show(view) {
    for (const v of ['overview', 'explorer', 'jobs']) $(v).hidden = v !== view;
    for (const tab of document.querySelectorAll('.tab')) {
      if (tab.dataset.view === view) tab.setAttribute('aria-current', 'page'); else tab.removeAttribute('aria-current');
    }
    if (view === 'jobs') refreshJobs().catch(report);
    if (view === 'explorer' && state.records.length === 0) browse().catch(report);
  }

  function report(e) {
    if (!(e instanceof Refused)) say(e.message, true);
  }

  // --- Overview ------------------------------------------------------------

  async function refreshOverview() {
    say('Loading…');
    const list = await api('GET', '/admin/dlq');
    const topic = list.topics[0];
    state.topic = topic.topic;
    state.source = topic.source_topic;
    state.partitions = topic.partitions.map((p) => p.partition);
    $('where').textContent = `${topic.source_topic} → ${topic.topic}`;
    $('dlq-topic').textContent = `in ${topic.topic}`;
    $('backlog-total').textContent = String(topic.backlog);
    $('lost').textContent = topic.lost_to_retention > 0
      ? `${topic.lost_to_retention} dead letters were deleted by retention before anyone replayed or acknowledged them.` : '';
    const body = $('partitions').tBodies[0];
    clear(body);
    for (const p of topic.partitions) {
      body.append(el('tr', {}, el('td', {}, p.partition), el('td', {}, p.earliest), el('td', {}, p.end_offset),
        el('td', {}, p.acknowledged_offset === null ? '—' : p.acknowledged_offset), el('td', { 'data-backlog': '' }, p.backlog)));
    }
    const select = $('browse-partition');
    while (select.options.length > 1) select.remove(1);
    for (const p of state.partitions) select.append(el('option', { value: String(p) }, `Partition ${p}`));

    await Promise.all([scanBacklog(topic), refreshListener(), refreshRecentJobs()]);
    say('');
  }

  // A bounded scan: the first page of the backlog (at most 100 records).
  async function scanBacklog(topic) {
    const page = await api('GET', `/admin/dlq/${encodeURIComponent(topic.topic)}/messages?limit=100`);
    const messages = page.messages;
    $('scan-read').textContent = `Read ${messages.length} of ${topic.backlog} records in the backlog${page.capped_by_bytes ? ' (stopped at 1 MiB)' : ''}.`;
    const oldest = messages.map((m) => m.timestamp).filter((t) => t !== null).reduce((a, b) => Math.min(a, b), Infinity);
    $('oldest').textContent = Number.isFinite(oldest) ? `${ago(oldest)} (${when(oldest)})` : 'none';
    counts($('reasons'), messages.map((m) => m.retry.reason || (m.retry.undecodable ? 'undecodable headers' : 'unknown')));
    counts($('kinds'), messages.map((m) => m.retry.error_kind || 'unknown'));
  }

  function counts(list, values) {
    clear(list);
    const tally = new Map();
    for (const v of values) tally.set(v, (tally.get(v) || 0) + 1);
    if (tally.size === 0) list.append(el('li', {}, 'none'));
    for (const [v, n] of [...tally].sort((a, b) => b[1] - a[1])) list.append(el('li', {}, `${v}: ${n}`));
  }

  async function refreshListener() {
    const l = await api('GET', '/admin/listener');
    $('listener-topic').textContent = l.topic;
    $('listener-group').textContent = l.group;
    $('brake-state').textContent = !l.consumed_here ? 'this instance consumes nothing'
      : l.brake ? `${l.brake.state}${l.brake.engaged_since_ms ? `, engaged since ${when(l.brake.engaged_since_ms)}` : ''}` : 'off';
    $('pause-state').textContent = l.pause
      ? `paused until ${when(l.pause.until_ms)}${l.pause.by ? ` by ${l.pause.by}` : ''}${l.pause.reason ? `: ${l.pause.reason}` : ''}`
      : 'not paused';
    const engagements = $('engagements');
    clear(engagements);
    const recent = l.brake ? l.brake.recent_engagements : [];
    if (recent.length === 0) engagements.append(el('li', {}, 'none'));
    for (const e of recent.slice().reverse()) engagements.append(el('li', {}, `${when(e.at_ms)}: ${e.failed} of ${e.calls} calls failed`));
    const body = $('lag').tBodies[0];
    clear(body);
    for (const t of l.lag) body.append(el('tr', {}, el('td', { class: 'mono' }, t.topic), el('td', { class: 'mono' }, t.group), el('td', {}, t.lag)));
  }

  async function refreshRecentJobs() {
    const { jobs } = await api('GET', '/admin/dlq/replays');
    const list = $('recent-jobs');
    clear(list);
    if (jobs.length === 0) list.append(el('li', {}, 'none on this instance'));
    for (const j of jobs.slice(0, 5)) {
      list.append(el('li', {}, `${when(j.started_at)}: ${j.report.dry_run ? 'dry run, ' : ''}${j.state}, ${j.report.replayed} replayed, ${j.report.skipped_total} refused (${j.operator})`));
    }
  }

  async function pause(event) {
    event.preventDefault();
    const body = { duration: $('pause-duration').value, reason: $('pause-reason').value };
    const answer = await api('POST', '/admin/listener/pause', body);
    say(`Paused every instance until ${when(answer.until_ms)}.`);
    await refreshListener();
  }

  async function resume() {
    const answer = await api('POST', '/admin/listener/resume');
    say(answer.was_paused ? 'Resumed every instance.' : 'Nothing was paused.');
    await refreshListener();
  }

  // --- Explorer ------------------------------------------------------------

  async function browse(more) {
    const partition = $('browse-partition').value;
    const limit = $('browse-limit').value;
    let path = `/admin/dlq/${encodeURIComponent(state.topic)}/messages?limit=${limit}`;
    const since = $('browse-since').value;
    if (since && !more) path += `&since_ms=${new Date(since).getTime()}`;
    if (partition !== '') {
      path += `&partition=${partition}`;
      const from = more && state.next ? state.next.offset : $('browse-offset').value;
      if (from !== '' && from !== null && from !== undefined) path += `&offset=${from}`;
    } else if (more && state.next) {
      // Across partitions, the next page is read partition by partition.
      const [p, o] = Object.entries(state.next.offsets).find(([pp, oo]) => oo !== null) || [];
      if (p === undefined) return;
      path += `&partition=${p}&offset=${o}`;
    }
    say('Reading…');
    const page = await api('GET', path);
    state.records = page.messages;
    state.next = partition !== '' ? (page.next_offset === null ? null : { offset: page.next_offset }) : { offsets: page.next_offsets };
    $('browse-next').disabled = page.messages.length === 0;
    fillFilters();
    renderRecords();
    say('');
  }

  function fillFilters() {
    for (const [select, values] of [
      [$('filter-reason'), state.records.map((r) => r.retry.reason).filter(Boolean)],
      [$('filter-kind'), state.records.map((r) => r.retry.error_kind).filter(Boolean)],
    ]) {
      const chosen = select.value;
      while (select.options.length > 1) select.remove(1);
      for (const v of [...new Set(values)].sort()) select.append(el('option', { value: v }, v));
      select.value = [...select.options].some((o) => o.value === chosen) ? chosen : '';
    }
  }

  function matching() {
    const reason = $('filter-reason').value;
    const kind = $('filter-kind').value;
    const key = $('filter-key').value;
    const needle = $('filter-text').value;
    const from = $('filter-from').value ? new Date($('filter-from').value).getTime() : null;
    const to = $('filter-to').value ? new Date($('filter-to').value).getTime() : null;
    return state.records.filter((r) => (!reason || r.retry.reason === reason)
      && (!kind || r.retry.error_kind === kind)
      && (!key || text(r.key).includes(key))
      && (!needle || text(r.payload).includes(needle))
      && (from === null || (r.timestamp !== null && r.timestamp >= from))
      && (to === null || (r.timestamp !== null && r.timestamp <= to)));
  }

  function renderRecords() {
    const shown = matching();
    $('browse-read').textContent = `Showing ${shown.length} of the ${state.records.length} records read (filters and the payload search look at the records read only).`;
    const body = $('records').tBodies[0];
    clear(body);
    for (const r of shown) {
      const box = el('input', { type: 'checkbox', 'aria-label': `Select partition ${r.partition} offset ${r.offset}` });
      box.checked = state.selected.has(id(r));
      box.addEventListener('change', () => {
        if (box.checked) state.selected.set(id(r), r); else state.selected.delete(id(r));
        selectionChanged();
      });
      const open = el('button', { type: 'button', 'aria-label': `Open partition ${r.partition} offset ${r.offset}` }, 'Open');
      open.addEventListener('click', () => openRecord(r, row));
      const row = el('tr', {}, el('td', {}, box), el('td', {}, r.partition), el('td', {}, r.offset),
        el('td', { class: 'mono' }, text(r.key)), el('td', {}, r.retry.reason || r.retry.undecodable || '—'),
        el('td', {}, r.retry.error_kind || '—'), el('td', {}, r.retry.attempt === null || r.retry.attempt === undefined ? '—' : r.retry.attempt),
        el('td', {}, when(r.timestamp)), el('td', {}, open));
      body.append(row);
    }
  }

  function selectionChanged() {
    const n = state.selected.size;
    $('selected-count').textContent = `${n} selected`;
    $('dry-run').disabled = n === 0;
    $('acknowledge').disabled = n === 0;
    $('replay').disabled = state.dryRun === null || state.dryRun !== selectionKey();
  }
  const selectionKey = () => [...state.selected.keys()].sort().join(',');

  function openRecord(r, row) {
    for (const other of $('records').tBodies[0].rows) other.classList.remove('open');
    row.classList.add('open');
    $('record').hidden = false;
    $('record-title').textContent = `Record ${r.partition}:${r.offset}`;
    const meta = $('record-meta');
    clear(meta);
    const add = (k, v) => meta.append(el('dt', {}, k), el('dd', {}, v === null || v === undefined ? '—' : v));
    add('Key', text(r.key));
    add('Dead-lettered', when(r.timestamp));
    add('Reason', r.retry.reason);
    add('Error kind', r.retry.error_kind);
    add('Last error', r.retry.error);
    add('From', r.retry.original_topic ? `${r.retry.original_topic}, partition ${r.retry.original_partition}, offset ${r.retry.original_offset}` : null);
    add('Replayed before', r.retry.replay_count);
    add('Trace', r.trace_id);
    if (r.retry.undecodable) add('Retry headers', `cannot be decoded: ${r.retry.undecodable}`);

    const timeline = $('timeline');
    clear(timeline);
    if (r.retry.first_seen_at) timeline.append(el('li', {}, `${when(r.retry.first_seen_at)}: the event was first produced`));
    const attempts = r.retry.attempts || [];
    attempts.forEach((a, i) => {
      const late = a.due_at_ms ? `, ${Math.max(0, a.failed_at_ms - a.due_at_ms)} ms after it was due at ${when(a.due_at_ms)}` : ' (due when produced)';
      timeline.append(el('li', {}, `${when(a.failed_at_ms)}: attempt ${i + 1} failed${late}`));
    });
    if (attempts.length === 0 && r.retry.first_failure_at) {
      timeline.append(el('li', {}, `${when(r.retry.first_failure_at)}: attempt 1 failed`));
      if (r.retry.attempt > 1) timeline.append(el('li', {}, `attempts 2 to ${r.retry.attempt}: not recorded by the ladder that wrote this record`));
    }
    timeline.append(el('li', {}, `${when(r.timestamp)}: dead-lettered${r.retry.reason ? ` (${r.retry.reason})` : ''}`));

    const headers = $('headers').tBodies[0];
    clear(headers);
    for (const h of r.headers) {
      headers.append(el('tr', {}, el('td', { class: 'mono' }, h.name), el('td', { class: 'mono' }, h.text !== undefined ? h.text : `base64:${h.base64}`)));
    }

    const payload = $('payload');
    if (r.payload && r.payload.text !== undefined) {
      try {
        payload.textContent = JSON.stringify(JSON.parse(r.payload.text), null, 2);
        $('payload-kind').textContent = '(JSON)';
      } catch (_) {
        payload.textContent = r.payload.text;
        $('payload-kind').textContent = '(text)';
      }
    } else if (r.payload) {
      payload.textContent = hex(r.payload.base64);
      $('payload-kind').textContent = '(binary, in hex)';
    } else {
      payload.textContent = '(null)';
      $('payload-kind').textContent = '';
    }
  }

  function hex(base64) {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const lines = [];
    for (let i = 0; i < bytes.length; i += 16) {
      const row = [...bytes.slice(i, i + 16)];
      lines.push(`${i.toString(16).padStart(8, '0')}  ${row.map((b) => b.toString(16).padStart(2, '0')).join(' ')}`);
    }
    return lines.join('\n');
  }

  // The selection, partition by partition.
  function byPartition() {
    const parts = new Map();
    for (const r of state.selected.values()) {
      if (!parts.has(r.partition)) parts.set(r.partition, []);
      parts.get(r.partition).push(r.offset);
    }
    return parts;
  }

  // One replay job per partition of the selection, each followed to its end.
  async function replaySelection(dryRun) {
    const result = $('action-result');
    clear(result);
    const key = selectionKey();
    let replayed = 0;
    const refused = [];
    for (const [partition, offsets] of byPartition()) {
      const path = `/admin/dlq/${encodeURIComponent(state.topic)}/replay?target_topic=${encodeURIComponent(state.source)}`;
      let job = await api('POST', path, { dry_run: dryRun, partition, offsets });
      result.replaceChildren(el('p', {}, `Job ${job.id} (partition ${partition}): ${job.state}…`));
      while (job.state === 'running') {
        await new Promise((resolve) => { setTimeout(resolve, 500); });
        job = await api('GET', `/admin/dlq/replays/${encodeURIComponent(job.id)}`);
        result.replaceChildren(el('p', {}, `Job ${job.id} (partition ${partition}): ${job.state}, ${job.report.replayed} so far`));
      }
      if (job.error) refused.push({ partition, offset: '—', reason: job.error });
      replayed += job.report.replayed;
      refused.push(...job.report.skipped);
    }
    clear(result);
    result.append(el('p', { class: 'ok', id: 'replay-summary' }, dryRun
      ? `Dry run: ${replayed} would be replayed into ${state.source}, ${refused.length} would be refused.`
      : `Replayed ${replayed} into ${state.source}; ${refused.length} refused.`));
    if (refused.length > 0) {
      const list = el('ul', {});
      for (const s of refused) list.append(el('li', {}, `${s.partition}:${s.offset}: ${s.reason}`));
      result.append(el('p', {}, dryRun ? 'What the guards would refuse:' : 'Refused:'), list);
    }
    state.dryRun = dryRun ? key : null;
    selectionChanged();
    if (!dryRun) {
      state.selected.clear();
      selectionChanged();
      await Promise.all([browse(), refreshOverview()]);
    }
  }

  async function acknowledge() {
    const n = state.selected.size;
    const result = $('action-result');
    for (const [partition, offsets] of byPartition()) {
      await api('POST', `/admin/dlq/${encodeURIComponent(state.topic)}/ack`, { partition, offsets });
    }
    state.selected.clear();
    state.dryRun = null;
    selectionChanged();
    result.replaceChildren(el('p', { class: 'ok' }, `Acknowledged ${n} records: they stay in the topic and leave the backlog.`));
    await Promise.all([browse(), refreshOverview()]);
  }

  // --- Jobs ----------------------------------------------------------------

  async function refreshJobs() {
    const { jobs } = await api('GET', '/admin/dlq/replays');
    const body = $('jobs-table').tBodies[0];
    clear(body);
    for (const j of jobs) {
      const open = el('button', { type: 'button' }, j.id.slice(0, 8));
      open.addEventListener('click', guarded(() => showJob(j)));
      body.append(el('tr', {}, el('td', {}, open), el('td', {}, `${j.report.dry_run ? 'dry run, ' : ''}${j.state}`), el('td', {}, j.operator),
        el('td', {}, when(j.started_at)), el('td', {}, j.report.replayed), el('td', {}, j.report.skipped_total)));
    }
  }

  // A job's outcome; a running one is followed until it ends.
  async function showJob(j) {
    const detail = $('job-detail');
    let job = j;
    for (;;) {
      clear(detail);
      detail.append(el('p', {}, `Job ${job.id}: ${job.report.dry_run ? 'dry run, ' : ''}${job.state}, into ${job.target_topic}, ${job.report.replayed} replayed, ${job.report.skipped_total} refused${job.error ? `: ${job.error}` : ''}`));
      const list = el('ul', {});
      for (const s of job.report.skipped) list.append(el('li', {}, `${s.partition}:${s.offset}: ${s.reason}`));
      detail.append(list);
      if (job.state !== 'running' || $('jobs').hidden) break;
      await new Promise((resolve) => { setTimeout(resolve, 500); });
      job = await api('GET', `/admin/dlq/replays/${encodeURIComponent(job.id)}`);
    }
    await refreshJobs();
  }

  // --- Wiring --------------------------------------------------------------

  const guarded = (f) => (...args) => { Promise.resolve(f(...args)).catch(report); };
  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', guarded(login));
    $('logout').addEventListener('click', () => logout(''));
    for (const tab of document.querySelectorAll('.tab')) tab.addEventListener('click', () => show(tab.dataset.view));
    $('pause-form').addEventListener('submit', guarded(pause));
    $('resume').addEventListener('click', guarded(resume));
    $('browse-form').addEventListener('submit', guarded((e) => { e.preventDefault(); return browse(false); }));
    $('browse-next').addEventListener('click', guarded(() => browse(true)));
    for (const input of document.querySelectorAll('#filter-form input, #filter-form select')) input.addEventListener('input', renderRecords);
    $('filter-form').addEventListener('submit', (e) => e.preventDefault());
    $('select-all').addEventListener('click', () => { for (const r of matching()) state.selected.set(id(r), r); renderRecords(); selectionChanged(); });
    $('select-none').addEventListener('click', () => { state.selected.clear(); renderRecords(); selectionChanged(); });
    $('dry-run').addEventListener('click', guarded(() => replaySelection(true)));
    $('replay').addEventListener('click', guarded(() => replaySelection(false)));
    $('acknowledge').addEventListener('click', guarded(acknowledge));
    if (sessionStorage.getItem(TOKEN)) enter().catch(report); else logout('');
  });
})();
