// The operators' console in a real browser (Debian's Chromium, driven by
// playwright-core), against a running billing-bin with real dead letters.
// Run by the integration test `console::the_console_...`, which prepares
// the dead letters and checks what the service did; this script prints one
// line per step and exits 1 at the first failure.
'use strict';

const fs = require('fs');
const path = require('path');

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run this through \`cargo xtask integration\``);
  return value;
};
const modules = env('KAFKA_RETRY_NODE_MODULES');
const { chromium } = require(path.join(modules, 'playwright-core'));
const axeSource = fs.readFileSync(path.join(modules, 'axe-core', 'axe.min.js'), 'utf8');

const URL = env('CONSOLE_URL');
const TOKEN = env('CONSOLE_TOKEN');
const REPLAY_KEY = env('CONSOLE_REPLAY_KEY');
const REPLAY_TRACE = env('CONSOLE_REPLAY_TRACE');
const ACK_KEY = env('CONSOLE_ACK_KEY');
const XSS_KEY = env('CONSOLE_XSS_KEY');
const XSS_PAYLOAD = env('CONSOLE_XSS_PAYLOAD');
const SHOTS = env('CONSOLE_SCREENSHOTS');
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-component-update', '--no-first-run'];

function check(condition, what) {
  if (!condition) throw new Error(`failed: ${what}`);
  console.log(`ok: ${what}`);
}

async function api(pathname) {
  const response = await fetch(`${URL}${pathname}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  if (!response.ok) throw new Error(`${pathname}: ${response.status}`);
  return response.json();
}

async function axe(page, what) {
  // Evaluated through the browser's debugging protocol: the page's policy
  // forbids inline scripts, and rightly refuses a script tag.
  await page.evaluate(axeSource);
  const result = await page.evaluate(async () => window.axe.run(document, { resultTypes: ['violations'] }));
  const serious = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  for (const v of serious) console.log(`axe: ${v.impact} ${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  check(serious.length === 0, `no serious or critical accessibility violation on ${what} (${result.violations.length} minor)`);
}

async function backlogMatchesTheApi(page, what) {
  const list = await api('/admin/dlq');
  const topic = list.topics[0];
  await page.waitForFunction((n) => document.getElementById('backlog-total').textContent === String(n), topic.backlog);
  const cells = await page.$$eval('#partitions tbody td[data-backlog]', (tds) => tds.map((td) => td.textContent));
  check(JSON.stringify(cells) === JSON.stringify(topic.partitions.map((p) => String(p.backlog))),
    `${what}: the backlog shown (${topic.backlog}, per partition ${cells}) is the API's`);
  return topic.backlog;
}

async function filterByKey(page, key) {
  await page.fill('#filter-key', key);
  await page.waitForFunction(() => document.querySelectorAll('#records tbody tr').length === 1);
}

async function main() {
  fs.mkdirSync(SHOTS, { recursive: true });
  const browser = await chromium.launch({ executablePath: env('KAFKA_RETRY_CHROMIUM'), args: FLAGS, headless: true });
  const errors = [];
  const watch = (page) => {
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('dialog', (d) => { errors.push(`a dialog opened: ${d.message()}`); d.dismiss(); });
  };
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    watch(page);
    await page.goto(`${URL}/console`);

    // A wrong token is refused, and nothing is kept.
    await page.fill('#token', 'not-the-token-0123456789');
    await page.click('#login-form button[type=submit]');
    await page.waitForFunction(() => document.getElementById('login-error').textContent.includes('refused'));
    check(await page.evaluate(() => sessionStorage.length === 0 && document.cookie === ''), 'a wrong token is refused and not kept');
    // The browser reports the 401 itself; that is the refusal, not a fault.
    errors.length = 0;

    await page.fill('#token', TOKEN);
    await page.fill('#operator', 'console-test');
    await page.click('#login-form button[type=submit]');
    await page.waitForSelector('#app:not([hidden])');
    check(await page.evaluate(() => document.cookie === ''), 'logged in, with no cookie');
    const before = await backlogMatchesTheApi(page, 'overview');
    await page.waitForFunction(() => document.getElementById('scan-read').textContent.startsWith('Read'));
    const reasons = await page.textContent('#reasons');
    check(reasons.includes('retries exhausted') || reasons.includes('retries-exhausted') || /\d/.test(reasons), `the backlog's reasons are counted (${reasons.trim()})`);
    await page.waitForFunction(() => document.querySelectorAll('#lag tbody tr').length > 0);
    await axe(page, 'the overview');
    await page.screenshot({ path: path.join(SHOTS, 'overview-1280.png'), fullPage: true });

    // The explorer: a filter, a record, a dry run, a replay.
    await page.click('.tab[data-view=explorer]');
    await page.waitForFunction(() => document.querySelectorAll('#records tbody tr').length > 0);
    await filterByKey(page, REPLAY_KEY);
    await page.click('#records tbody tr button');
    await page.waitForSelector('#record:not([hidden])');
    check((await page.textContent('#payload')).includes(REPLAY_KEY), 'the record view shows the payload, pretty-printed');
    check((await page.textContent('#headers')).includes('x-retry-attempt'), 'the record view lists the retry headers');
    check((await page.textContent('#record-meta')).includes(REPLAY_TRACE), 'the record view shows its trace id');
    const timeline = await page.$$eval('#timeline li', (lis) => lis.map((li) => li.textContent));
    check(timeline.filter((t) => / attempt \d failed/.test(t)).length === 3 && timeline.some((t) => t.includes('after it was due')),
      `the record view shows when each attempt was due and failed (${timeline.join(' | ')})`);
    await axe(page, 'the explorer with a record open');
    await page.screenshot({ path: path.join(SHOTS, 'explorer-1280.png'), fullPage: true });
    await page.check('#records tbody tr input[type=checkbox]');
    check(await page.isDisabled('#replay'), 'a replay waits for its dry run');
    await page.click('#dry-run');
    await page.waitForSelector('#replay-summary');
    const dry = await page.textContent('#replay-summary');
    check(dry.includes('Dry run: 1 would be replayed'), `the dry run says what would go (${dry})`);
    await page.click('#replay');
    await page.waitForFunction(() => (document.getElementById('replay-summary') || {}).textContent?.startsWith('Replayed'));
    const done = await page.textContent('#replay-summary');
    check(done.includes('Replayed 1'), `the replay ran to its end (${done})`);

    // Acknowledge another record: it leaves the backlog.
    await filterByKey(page, ACK_KEY);
    await page.check('#records tbody tr input[type=checkbox]');
    await page.click('#acknowledge');
    await page.waitForFunction(() => document.getElementById('action-result').textContent.includes('Acknowledged 1'));
    await page.click('.tab[data-view=overview]');
    const after = await backlogMatchesTheApi(page, 'after the replay and the acknowledgement');
    check(after === before - 2, `the backlog went from ${before} to ${after}`);

    // A hostile record is shown as it is and runs nothing.
    await page.click('.tab[data-view=explorer]');
    await filterByKey(page, XSS_KEY);
    await page.click('#records tbody tr button');
    await page.waitForSelector('#record:not([hidden])');
    const shownKey = await page.textContent('#records tbody tr td.mono');
    check(shownKey === XSS_KEY, 'the hostile key is shown verbatim');
    const shownPayload = await page.textContent('#payload');
    check(shownPayload.includes('<script>') && shownPayload.includes('onerror='), 'the hostile payload is shown verbatim');
    const headers = await page.textContent('#headers');
    check(headers.includes('onerror=') && headers.includes('<script>'), 'the hostile headers are shown verbatim');
    check(await page.evaluate(() => window.__xss === undefined), 'nothing the hostile record carries ran');
    check((await page.$$('#app img, #app script')).length === 0, 'no element came from the hostile record');
    void XSS_PAYLOAD;

    // Pause every instance, then resume.
    await page.click('.tab[data-view=overview]');
    await page.selectOption('#pause-duration', '5m');
    await page.fill('#pause-reason', 'console test');
    await page.click('#pause-form button[type=submit]');
    await page.waitForFunction(() => document.getElementById('pause-state').textContent.startsWith('paused until'));
    check((await api('/admin/listener')).pause?.reason === 'console test' || (await api('/admin/listener')).pause !== null,
      'the pause is the group\'s, as the API says');
    await page.click('#resume');
    await page.waitForFunction(() => document.getElementById('pause-state').textContent === 'not paused');
    check((await api('/admin/listener')).pause === null, 'resumed, as the API says');

    // The jobs this instance ran.
    await page.click('.tab[data-view=jobs]');
    await page.waitForFunction(() => document.querySelectorAll('#jobs-table tbody tr').length >= 2);
    await page.click('#jobs-table tbody tr button');
    await page.waitForFunction(() => document.getElementById('job-detail').textContent.includes('succeeded'));
    const job = await page.textContent('#job-detail');
    check(/^Job [0-9a-f-]+: succeeded, into .*, 1 replayed, 0 refused/.test(job), `the jobs are listed, newest first, with their outcome (${job})`);

    // A phone's width.
    const narrow = await browser.newContext({ viewport: { width: 390, height: 844 } });
    const phone = await narrow.newPage();
    watch(phone);
    await phone.goto(`${URL}/console`);
    await phone.fill('#token', TOKEN);
    await phone.click('#login-form button[type=submit]');
    await phone.waitForFunction(() => document.querySelectorAll('#lag tbody tr').length > 0);
    await phone.screenshot({ path: path.join(SHOTS, 'overview-390.png'), fullPage: true });
    await phone.click('.tab[data-view=explorer]');
    await phone.waitForFunction(() => document.querySelectorAll('#records tbody tr').length > 0);
    await phone.screenshot({ path: path.join(SHOTS, 'explorer-390.png'), fullPage: true });
    const wide = await phone.evaluate(() => document.documentElement.scrollWidth);
    const widest = await phone.evaluate(() => [...document.querySelectorAll('body *')]
      .filter((e) => e.getBoundingClientRect().right > 391 && (!e.parentElement.closest('.scroll')))
      .map((e) => `${e.tagName.toLowerCase()}${e.id ? `#${e.id}` : ''}${e.className ? `.${e.className}` : ''} (${Math.round(e.getBoundingClientRect().right)}px)`)
      .slice(0, 8).join(', '));
    check(wide <= 390, `nothing wider than the phone's screen (${wide}px${widest ? `: ${widest}` : ''})`);
    await axe(phone, 'the explorer at 390px');

    // Logging out forgets the token.
    await page.click('#logout');
    await page.waitForSelector('#login:not([hidden])');
    check(await page.evaluate(() => sessionStorage.length === 0), 'logging out forgets the token');

    check(errors.length === 0, `no console errors${errors.length ? `: ${errors.join(' | ')}` : ''}`);
  } finally {
    await browser.close();
  }
}

main().then(() => process.exit(0), (e) => { console.error(e.stack || String(e)); process.exit(1); });
