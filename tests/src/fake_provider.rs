//! A fake billing provider: the HTTP API that `billing` charges through, on
//! loopback, with a ledger to check against and faults to inject. Integration
//! tests and `cargo xtask demo` use it; the service itself never does.
//!
//! The API, as the real provider's contract has it (`docs/operations/billing.md`,
//! "The billing provider contract"):
//!
//! - `POST /charges` with `{"order_id", "customer_id", "amount": "120.50",
//!   "currency": "EUR"}` and an `Idempotency-Key` header: 201 charged; 409
//!   when the key is known (its charge is still being processed, succeeded,
//!   or was made with another body), and nothing is charged again; 400
//!   without the header or with a body that is not such a charge (the
//!   amount a string, a positive decimal; the currency three letters).
//!   A charge whose processing failed frees its key: the next request
//!   under it charges anew. A key is forgotten [`Faults::key_ttl`] after
//!   its charge, as real providers forget theirs after a day or so; a
//!   request under a forgotten key charges again.
//! - `GET /charges/{key}`: the charge under that key, `{"order_id",
//!   "customer_id", "amount", "currency", "status"}` with `status` one of
//!   `pending`, `succeeded`, `failed`; 404 for an unknown or forgotten key.
//! - `GET /ledger`: every completed charge, as JSON (see [`Charge`]).
//! - `GET /requests`: how many requests were answered with each status.
//! - `PUT /script/{order_id}` with a [`Script`] as JSON: what to do with the
//!   next requests for that order, so a test in another process can script it.
//! - `PUT /outage` with `on` or `off`: starts or ends an outage, every
//!   request answered 503 meanwhile ([`FakeProvider::set_down`]).
//! - `PUT /faults` with a [`FaultChange`] as JSON (`{"transient_pct": 20}`):
//!   changes the random mix from then on; the answer is the whole mix.
//!   `GET /faults` shows it.
//!
//! Faults come from a [`Script`] per order, else from the random mix of
//! [`Faults`]. The mix is deterministic per order id given the seed, and a
//! transient fault covers only an order's first requests, so a retry of the
//! same order can succeed, as it would against a provider that recovered.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post, put},
    Json, Router,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use tokio::{sync::watch, task::JoinHandle};

/// The header that makes a charge idempotent.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The random mix of faults, drawn once per order id. The three shares are
/// percentages of orders and must add up to at most 100; the rest of the
/// orders are charged without trouble. [`Faults::default`] injects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Orders whose first requests fail with a transient status (503, 502,
    /// 500 or 429), then succeed.
    pub transient_pct: u8,
    /// How many first requests a transient order fails: drawn per order from
    /// `1..=transient_max_failures` (at least 1).
    pub transient_max_failures: u32,
    /// Orders that are always refused with 400, as a declined card.
    pub permanent_pct: u8,
    /// Orders whose first request is charged but answered only after [`Faults::slow`]:
    /// a client that gives up earlier does not know the charge happened.
    pub slow_pct: u8,
    /// How late a slow order's first request is answered.
    pub slow: Duration,
    /// Seeds the draw: the same seed gives every order the same fault.
    pub seed: u64,
    /// How long every answer takes at least, as a real provider's does
    /// (a slow order's first answer takes this plus [`Faults::slow`]); a
    /// charge is `pending` that long.
    pub latency: Duration,
    /// How long an idempotency key is remembered after its charge; `None`
    /// remembers keys for good.
    pub key_ttl: Option<Duration>,
}

impl Faults {
    /// Checks that the shares add up to at most 100%.
    pub fn validate(&self) -> Result<(), String> {
        let total = u32::from(self.transient_pct) + u32::from(self.permanent_pct) + u32::from(self.slow_pct);
        if total > 100 {
            return Err(format!(
                "fault shares add up to {total}% (transient {}%, permanent {}%, slow {}%): at most 100% of orders can fail",
                self.transient_pct, self.permanent_pct, self.slow_pct
            ));
        }
        Ok(())
    }

    /// The fault `order_id` gets under this mix.
    pub fn plan(&self, order_id: &str) -> OrderFault {
        let roll = draw(self.seed, order_id, 1) % 100;
        let permanent = u64::from(self.permanent_pct);
        let transient = permanent + u64::from(self.transient_pct);
        let slow = transient + u64::from(self.slow_pct);
        if roll < permanent {
            OrderFault::Permanent
        } else if roll < transient {
            const STATUSES: [u16; 4] = [503, 502, 500, 429];
            let failures = 1 + draw(self.seed, order_id, 2) % u64::from(self.transient_max_failures.max(1));
            let status = STATUSES[(draw(self.seed, order_id, 3) % STATUSES.len() as u64) as usize];
            OrderFault::Transient { failures: failures as u32, status }
        } else if roll < slow {
            OrderFault::Slow
        } else {
            OrderFault::Healthy
        }
    }
}

/// What the random mix does to one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OrderFault {
    /// Charged at the first request.
    Healthy,
    /// The first `failures` requests are answered `status`, then charged.
    Transient {
        /// How many first requests fail.
        failures: u32,
        /// Their status: 503, 502, 500 or 429.
        status: u16,
    },
    /// Every request is refused with 400.
    Permanent,
    /// The first request is charged, but answered only after [`Faults::slow`].
    Slow,
}

/// What to do with the next requests for one order, instead of its random
/// fault. As JSON: `{"kind": "fail_times", "times": 2}`, `{"kind": "reject"}`,
/// `{"kind": "hang", "times": 1, "delay_ms": 3000}`,
/// `{"kind": "fail_late", "delay_ms": 3000}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Script {
    /// Answer the next `times` requests 503, then charge as usual.
    FailTimes {
        /// How many requests fail.
        times: u32,
    },
    /// Answer every request 400, as for a declined card.
    Reject,
    /// Charge as usual, but answer each of the next `times` requests only
    /// after `delay`: the charge is `pending` meanwhile and succeeds at the
    /// end, as when a provider's answer comes too late for the client.
    Hang {
        /// How many requests are answered late.
        times: u32,
        /// How late.
        #[serde(rename = "delay_ms", with = "millis")]
        delay: Duration,
    },
    /// Hold the next request for `delay` with its charge `pending`, then
    /// fail it (502, status `failed`); later requests charge as usual. A
    /// client that gave up and asks again meanwhile hears 409: taking that
    /// for "charged" loses the charge.
    FailLate {
        /// How long the charge stays pending.
        #[serde(rename = "delay_ms", with = "millis")]
        delay: Duration,
    },
}

/// One charge in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The `Idempotency-Key` it was charged under.
    pub idempotency_key: String,
    /// The order, as the request named it.
    pub order_id: String,
    /// The customer, as the request named it.
    pub customer_id: String,
    /// The amount, as the request wrote it.
    pub amount: String,
    /// Its currency code, as the request wrote it.
    pub currency: String,
    /// Every request seen with this idempotency key, whatever its answer.
    pub requests: u32,
}

/// A running fake provider. It stops on [`FakeProvider::stop`] or when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Option<JoinHandle<()>>,
}

impl FakeProvider {
    /// Starts a provider on `127.0.0.1` at a free port, with `faults`.
    ///
    /// Panics when `faults` do not [validate](Faults::validate) or no port
    /// can be bound: it is test support, and the test cannot go on.
    pub async fn start(faults: Faults) -> FakeProvider {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        match FakeProvider::start_on(addr, faults).await {
            Ok(provider) => provider,
            Err(e) => panic!("cannot start the fake billing provider on {addr}: {e}"),
        }
    }

    /// Starts a provider listening on `addr`, with `faults`.
    ///
    /// Panics when `faults` do not [validate](Faults::validate).
    pub async fn start_on(addr: SocketAddr, faults: Faults) -> std::io::Result<FakeProvider> {
        if let Err(e) = faults.validate() {
            panic!("invalid faults for the fake billing provider: {e}");
        }
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            faults: Mutex::new(faults),
            books: Mutex::default(),
            down: Default::default(),
            shutdown: watch::Sender::new(false),
        });
        let router = Router::new()
            .route("/charges", post(charge))
            .route("/charges/{key}", get(charge_status))
            .route("/ledger", get(ledger))
            .route("/requests", get(requests))
            .route("/arrivals", get(arrivals))
            .route("/script/{order_id}", put(script))
            .route("/outage", put(outage))
            .route("/faults", get(show_faults).put(change_faults))
            .with_state(shared.clone());
        let mut shutdown = shared.shutdown.subscribe();
        let server = tokio::spawn(async move {
            let stopped = async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            };
            if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(stopped).await {
                eprintln!("the fake billing provider stopped serving: {e}");
            }
        });
        Ok(FakeProvider { addr, shared, server: Some(server) })
    }

    /// The base URL, `http://127.0.0.1:PORT`, to configure as the provider's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The random mix of faults now: the one it was started with, unless
    /// `PUT /faults` changed it.
    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// Scripts the next requests for `order_id`, replacing its random fault
    /// (and any earlier script) for good.
    pub fn script(&self, order_id: &str, script: Script) {
        self.shared.books().scripts.insert(order_id.to_owned(), script);
    }

    /// Starts (`true`) or ends an outage: meanwhile every request, charges
    /// and confirmations alike, is answered 503 and nothing is charged.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every completed charge, in the order they were made.
    pub fn ledger(&self) -> Vec<Charge> {
        self.shared.books().ledger()
    }

    /// The completed charges of `order_id`: more than one is a double charge.
    pub fn charges_for(&self, order_id: &str) -> Vec<Charge> {
        self.ledger().into_iter().filter(|c| c.order_id == order_id).collect()
    }

    /// When each request for `order_id` arrived, in ms since the epoch (the
    /// wall clock: comparable with the due times records carry).
    pub fn arrivals(&self, order_id: &str) -> Vec<i64> {
        self.shared.books().arrivals_by_order.get(order_id).cloned().unwrap_or_default()
    }

    /// The `traceparent` each request for `order_id` carried, in order
    /// (empty for a request without one).
    pub fn traceparents(&self, order_id: &str) -> Vec<String> {
        self.shared.books().traceparents_by_order.get(order_id).cloned().unwrap_or_default()
    }

    /// How many requests were answered with each status.
    pub fn requests(&self) -> BTreeMap<u16, u64> {
        self.shared.books().statuses.clone()
    }

    /// Stops serving: requests still waiting on a delay are answered 503 at
    /// once, and the server is gone when this returns.
    pub async fn stop(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        // The server task notices and ends by itself; a drop cannot await it.
        self.shared.shutdown.send_replace(true);
    }
}

/// What the handlers share.
struct Shared {
    /// The random mix, which `PUT /faults` may change while serving.
    faults: Mutex<Faults>,
    books: Mutex<Books>,
    /// While true, an outage: every request is answered 503 and nothing is charged.
    down: std::sync::atomic::AtomicBool,
    /// Turns true once the provider stops; delayed answers give up then.
    shutdown: watch::Sender<bool>,
}

impl Shared {
    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn faults(&self) -> Faults {
        self.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        // A handler that panicked mid-update left nothing half-done worth refusing to read.
        self.books.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The provider's memory.
#[derive(Default)]
struct Books {
    /// Every charge attempt, completed, pending or failed, in order.
    attempts: Vec<Attempt>,
    /// The latest attempt under each idempotency key.
    by_key: HashMap<String, usize>,
    /// Requests per idempotency key, charged or not.
    requests_by_key: HashMap<String, u32>,
    /// Requests per order: the attempt number that random faults go by.
    requests_by_order: HashMap<String, u32>,
    /// When each request for an order arrived, in ms since the epoch.
    arrivals_by_order: HashMap<String, Vec<i64>>,
    /// The `traceparent` of each request for an order (empty when it had none).
    traceparents_by_order: HashMap<String, Vec<String>>,
    scripts: HashMap<String, Script>,
    statuses: BTreeMap<u16, u64>,
}

/// One charge under one idempotency key.
struct Attempt {
    charge: Charge,
    /// When it was made: its key is forgotten [`Faults::key_ttl`] later.
    made_at: Instant,
    /// When its processing ends; it is `pending` until then.
    settles_at: Instant,
    /// Whether its processing ends in failure.
    fails: bool,
}

/// Where a charge stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Pending,
    Succeeded,
    Failed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }
}

impl Attempt {
    fn status(&self, now: Instant) -> Status {
        match (now < self.settles_at, self.fails) {
            (true, _) => Status::Pending,
            (false, false) => Status::Succeeded,
            (false, true) => Status::Failed,
        }
    }
}

/// How a request that is not refused at once is processed.
#[derive(Debug, Clone, Copy, Default)]
struct Processing {
    /// How long before it settles (and is answered), beyond the latency.
    delay: Duration,
    /// Whether it fails when it settles.
    fails: bool,
}

impl Books {
    fn ledger(&self) -> Vec<Charge> {
        let now = Instant::now();
        self.attempts
            .iter()
            .filter(|a| a.status(now) == Status::Succeeded)
            .map(|a| Charge { requests: self.requests_by_key[&a.charge.idempotency_key], ..a.charge.clone() })
            .collect()
    }

    /// The latest attempt under `key`, unless the key was forgotten.
    fn remembered(&self, key: &str, key_ttl: Option<Duration>, now: Instant) -> Option<&Attempt> {
        let attempt = &self.attempts[*self.by_key.get(key)?];
        let forgotten = key_ttl.is_some_and(|ttl| now.saturating_duration_since(attempt.made_at) >= ttl);
        (!forgotten).then_some(attempt)
    }

    /// What `order_id`'s script or random fault does to its `attempt`-th
    /// request: fail with a status, or go on (after a delay, to fail late).
    fn fault(&mut self, faults: &Faults, order_id: &str, attempt: u32) -> Result<Processing, (StatusCode, String)> {
        if let Some(script) = self.scripts.get_mut(order_id) {
            return match script {
                Script::FailTimes { times } if *times > 0 => {
                    *times -= 1;
                    Err((StatusCode::SERVICE_UNAVAILABLE, "scripted outage: try again later".into()))
                }
                Script::Hang { times, delay } if *times > 0 => {
                    *times -= 1;
                    Ok(Processing { delay: *delay, fails: false })
                }
                Script::FailLate { delay } => {
                    let processing = Processing { delay: *delay, fails: true };
                    // Scripts hold for good: from now on, charge as usual.
                    *script = Script::FailTimes { times: 0 };
                    Ok(processing)
                }
                Script::Reject => Err((StatusCode::BAD_REQUEST, "card declined (scripted)".into())),
                Script::FailTimes { .. } | Script::Hang { .. } => Ok(Processing::default()),
            };
        }
        match faults.plan(order_id) {
            OrderFault::Permanent => Err((StatusCode::BAD_REQUEST, "card declined (fake permanent fault)".into())),
            OrderFault::Transient { failures, status } if attempt <= failures => Err((
                StatusCode::from_u16(status).expect("the fault statuses are valid"),
                format!("fake transient fault {attempt} of {failures}: try again later"),
            )),
            OrderFault::Slow if attempt == 1 => Ok(Processing { delay: faults.slow, fails: false }),
            OrderFault::Transient { .. } | OrderFault::Slow | OrderFault::Healthy => Ok(Processing::default()),
        }
    }
}

/// The body of `POST /charges`.
#[derive(Deserialize)]
struct ChargeRequest {
    order_id: String,
    customer_id: String,
    amount: String,
    currency: String,
}

/// The answer to a charge: a status and a JSON body.
type Answer = (StatusCode, Json<serde_json::Value>);

async fn charge(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Answer {
    let (answer, delay) = decide(&shared, &headers, &body);
    if delay.is_zero() {
        return answer;
    }
    let mut shutdown = shared.shutdown.subscribe();
    tokio::select! {
        () = tokio::time::sleep(delay) => answer,
        _ = shutdown.wait_for(|stop| *stop) => refuse(StatusCode::SERVICE_UNAVAILABLE, "the fake provider is stopping"),
    }
}

/// Books the charge (or not) and says how to answer and how long to wait first.
fn decide(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> (Answer, Duration) {
    let faults = shared.faults();
    let mut books = shared.books();
    if shared.is_down() {
        *books.statuses.entry(503).or_default() += 1;
        return (refuse(StatusCode::SERVICE_UNAVAILABLE, "the provider is down"), faults.latency);
    }
    let (answer, delay) = book(&mut books, &faults, headers, body)
        .unwrap_or_else(|(status, message)| (refuse(status, &message), Duration::ZERO));
    *books.statuses.entry(answer.0.as_u16()).or_default() += 1;
    (answer, delay + faults.latency)
}

fn book(
    books: &mut Books,
    faults: &Faults,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Answer, Duration), (StatusCode, String)> {
    let bad = |message: String| (StatusCode::BAD_REQUEST, message);
    let key = match headers.get(IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        Some(Ok(key)) if !key.trim().is_empty() => key.to_owned(),
        Some(_) => return Err(bad("the Idempotency-Key header is empty or not text".into())),
        None => return Err(bad("missing Idempotency-Key header".into())),
    };
    let request: ChargeRequest =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid charge request: {e}")))?;
    match Decimal::from_str(&request.amount) {
        Ok(amount) if amount > Decimal::ZERO => {}
        Ok(amount) => return Err(bad(format!("amount must be positive, got {amount}"))),
        Err(e) => return Err(bad(format!("amount {:?} is not a decimal: {e}", request.amount))),
    }
    if request.currency.len() != 3 || !request.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad(format!("currency {:?} is not an ISO 4217 code", request.currency)));
    }

    *books.requests_by_key.entry(key.clone()).or_default() += 1;
    let attempt = {
        let n = books.requests_by_order.entry(request.order_id.clone()).or_default();
        *n += 1;
        *n
    };
    let arrived = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    books.arrivals_by_order.entry(request.order_id.clone()).or_default().push(arrived.as_millis() as i64);
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    books.traceparents_by_order.entry(request.order_id.clone()).or_default().push(traceparent);
    let processing = books.fault(faults, &request.order_id, attempt)?;

    let now = Instant::now();
    if let Some(earlier) = books.remembered(&key, faults.key_ttl, now) {
        let same =
            (&earlier.charge.order_id, &earlier.charge.customer_id, &earlier.charge.amount, &earlier.charge.currency)
                == (&request.order_id, &request.customer_id, &request.amount, &request.currency);
        let conflict = match earlier.status(now) {
            _ if !same => Some("idempotency key already used with other parameters"),
            Status::Pending => Some("a charge under this idempotency key is still being processed"),
            Status::Succeeded => Some("already charged under this idempotency key"),
            // The failed attempt is over: this request charges anew.
            Status::Failed => None,
        };
        if let Some(error) = conflict {
            let body = serde_json::json!({ "error": error, "charge_id": charge_id(books.by_key[&key]) });
            return Ok(((StatusCode::CONFLICT, Json(body)), Duration::ZERO));
        }
    }
    let index = books.attempts.len();
    books.by_key.insert(key.clone(), index);
    books.attempts.push(Attempt {
        charge: Charge {
            idempotency_key: key,
            order_id: request.order_id.clone(),
            customer_id: request.customer_id,
            amount: request.amount,
            currency: request.currency,
            requests: 0,
        },
        made_at: now,
        settles_at: now + processing.delay + faults.latency,
        fails: processing.fails,
    });
    let answer = if processing.fails {
        refuse(StatusCode::BAD_GATEWAY, "the charge failed while being processed: try again")
    } else {
        let body =
            serde_json::json!({ "charge_id": charge_id(index), "order_id": request.order_id, "status": "charged" });
        (StatusCode::CREATED, Json(body))
    };
    Ok((answer, processing.delay))
}

/// `GET /charges/{key}`: the charge under `key`, as the contract has it.
async fn charge_status(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Answer {
    if shared.is_down() {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "the provider is down");
    }
    let now = Instant::now();
    let key_ttl = shared.faults().key_ttl;
    let books = shared.books();
    match books.remembered(&key, key_ttl, now) {
        Some(attempt) => {
            let c = &attempt.charge;
            let body = serde_json::json!({
                "charge_id": charge_id(books.by_key[&key]),
                "idempotency_key": c.idempotency_key,
                "order_id": c.order_id,
                "customer_id": c.customer_id,
                "amount": c.amount,
                "currency": c.currency,
                "status": attempt.status(now).as_str(),
            });
            (StatusCode::OK, Json(body))
        }
        None => refuse(StatusCode::NOT_FOUND, "no charge under this idempotency key"),
    }
}

fn charge_id(index: usize) -> String {
    format!("ch_{:06}", index + 1)
}

fn refuse(status: StatusCode, message: &str) -> Answer {
    (status, Json(serde_json::json!({ "error": message })))
}

async fn ledger(State(shared): State<Arc<Shared>>) -> Json<Vec<Charge>> {
    Json(shared.books().ledger())
}

async fn requests(State(shared): State<Arc<Shared>>) -> Json<BTreeMap<u16, u64>> {
    Json(shared.books().statuses.clone())
}

/// `GET /arrivals`: when each request for an order that was asked more
/// than once arrived, in ms since the epoch: how late retries came.
async fn arrivals(State(shared): State<Arc<Shared>>) -> Json<BTreeMap<String, Vec<i64>>> {
    let books = shared.books();
    Json(books.arrivals_by_order.iter().filter(|(_, a)| a.len() > 1).map(|(o, a)| (o.clone(), a.clone())).collect())
}

async fn script(State(shared): State<Arc<Shared>>, Path(order_id): Path<String>, body: Bytes) -> Answer {
    match serde_json::from_slice::<Script>(&body) {
        Ok(script) => {
            shared.books().scripts.insert(order_id.clone(), script);
            (StatusCode::OK, Json(serde_json::json!({ "order_id": order_id, "script": script })))
        }
        Err(e) => refuse(StatusCode::BAD_REQUEST, &format!("invalid script: {e}")),
    }
}

/// `PUT /outage`: `on` starts an outage, `off` ends it.
async fn outage(State(shared): State<Arc<Shared>>, body: Bytes) -> Answer {
    let down = match body.trim_ascii() {
        b"on" | b"true" => true,
        b"off" | b"false" => false,
        other => {
            let got = String::from_utf8_lossy(other);
            return refuse(StatusCode::BAD_REQUEST, &format!("expected `on` or `off`, got {got:?}"));
        }
    };
    shared.down.store(down, std::sync::atomic::Ordering::SeqCst);
    (StatusCode::OK, Json(serde_json::json!({ "outage": down })))
}

/// A change of the random mix of faults: the fields given replace the
/// mix's, the others stay. As JSON: `{"transient_pct": 20,
/// "permanent_pct": 5, "slow_pct": 0, "latency_ms": 50}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultChange {
    /// The new [`Faults::transient_pct`].
    pub transient_pct: Option<u8>,
    /// The new [`Faults::transient_max_failures`].
    pub transient_max_failures: Option<u32>,
    /// The new [`Faults::permanent_pct`].
    pub permanent_pct: Option<u8>,
    /// The new [`Faults::slow_pct`].
    pub slow_pct: Option<u8>,
    /// The new [`Faults::latency`], in ms.
    pub latency_ms: Option<u64>,
}

impl FaultChange {
    /// `faults` with this change, checked.
    pub fn apply(&self, faults: &Faults) -> Result<Faults, String> {
        let changed = Faults {
            transient_pct: self.transient_pct.unwrap_or(faults.transient_pct),
            transient_max_failures: self.transient_max_failures.unwrap_or(faults.transient_max_failures),
            permanent_pct: self.permanent_pct.unwrap_or(faults.permanent_pct),
            slow_pct: self.slow_pct.unwrap_or(faults.slow_pct),
            latency: self.latency_ms.map_or(faults.latency, Duration::from_millis),
            ..faults.clone()
        };
        changed.validate()?;
        Ok(changed)
    }
}

/// The mix as `GET /faults` shows it.
fn faults_json(faults: &Faults) -> serde_json::Value {
    serde_json::json!({
        "transient_pct": faults.transient_pct,
        "transient_max_failures": faults.transient_max_failures,
        "permanent_pct": faults.permanent_pct,
        "slow_pct": faults.slow_pct,
        "slow_ms": faults.slow.as_millis() as u64,
        "latency_ms": faults.latency.as_millis() as u64,
        "seed": faults.seed,
    })
}

async fn show_faults(State(shared): State<Arc<Shared>>) -> Answer {
    (StatusCode::OK, Json(faults_json(&shared.faults())))
}

/// `PUT /faults`: changes the random mix from the next request on.
async fn change_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Answer {
    let change: FaultChange = match serde_json::from_slice(&body) {
        Ok(change) => change,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("invalid change of faults: {e}")),
    };
    let mut faults = shared.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match change.apply(&faults) {
        Ok(changed) => {
            *faults = changed;
            (StatusCode::OK, Json(faults_json(&faults)))
        }
        Err(e) => refuse(StatusCode::BAD_REQUEST, &e),
    }
}

/// A number in `0..2^64` that depends only on the seed, the order and `salt`
/// (one salt per decision). SplitMix64 rather than std's hasher, whose output
/// may change between Rust releases: a seed must replay the same faults.
fn draw(seed: u64, order_id: &str, salt: u64) -> u64 {
    let mut h = splitmix64(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for byte in order_id.bytes() {
        h = splitmix64(h ^ u64::from(byte));
    }
    h
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A `Duration` as whole milliseconds in JSON.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().try_into().unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    /// Talks to one provider as the billing handler would.
    struct Client {
        http: reqwest::Client,
        url: String,
    }

    impl Client {
        fn of(provider: &FakeProvider) -> Client {
            Client::with_timeout(provider, Duration::from_secs(10))
        }

        fn with_timeout(provider: &FakeProvider, timeout: Duration) -> Client {
            Client { http: reqwest::Client::builder().timeout(timeout).build().unwrap(), url: provider.url() }
        }

        /// Charges `order` under the key `event-<order>`.
        async fn charge(&self, order: &str) -> reqwest::Result<u16> {
            self.post(Some(&format!("event-{order}")), &charge_body(order).to_string()).await
        }

        async fn post(&self, key: Option<&str>, body: &str) -> reqwest::Result<u16> {
            let mut request = self
                .http
                .post(format!("{}/charges", self.url))
                .header("content-type", "application/json")
                .body(body.to_owned());
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            Ok(request.send().await?.status().as_u16())
        }

        async fn get(&self, path: &str) -> Value {
            self.http.get(format!("{}{path}", self.url)).send().await.unwrap().json().await.unwrap()
        }

        async fn put(&self, path: &str, body: &str) -> (u16, Value) {
            let response = self.http.put(format!("{}{path}", self.url)).body(body.to_owned()).send().await.unwrap();
            (response.status().as_u16(), response.json().await.unwrap())
        }

        async fn put_script(&self, order: &str, script: &str) -> u16 {
            let url = format!("{}/script/{order}", self.url);
            self.http.put(url).body(script.to_owned()).send().await.unwrap().status().as_u16()
        }
    }

    fn charge_body(order: &str) -> Value {
        json!({ "order_id": order, "customer_id": format!("customer-{order}"), "amount": "120.50", "currency": "EUR" })
    }

    fn ledger_entry(order: &str, requests: u32) -> Charge {
        Charge {
            idempotency_key: format!("event-{order}"),
            order_id: order.into(),
            customer_id: format!("customer-{order}"),
            amount: "120.50".into(),
            currency: "EUR".into(),
            requests,
        }
    }

    /// Charges `order` once per expected status, under one key, and checks the answers.
    async fn check(client: &Client, order: &str, expected: &[u16]) {
        let mut got = Vec::new();
        for _ in expected {
            got.push(client.charge(order).await.unwrap());
        }
        assert_eq!(got, expected, "statuses of the charges of {order}");
    }

    #[tokio::test]
    async fn a_key_is_charged_once() {
        let provider = FakeProvider::start(Faults::default()).await;
        check(&Client::of(&provider), "o-1", &[201, 409, 409]).await;
        assert_eq!(provider.ledger(), [ledger_entry("o-1", 3)]);
        assert_eq!(provider.charges_for("o-1"), [ledger_entry("o-1", 3)]);
        assert_eq!(provider.charges_for("o-2"), []);
        assert_eq!(provider.requests(), BTreeMap::from([(201, 1), (409, 2)]));
    }

    #[tokio::test]
    async fn malformed_charges_are_refused() {
        let valid = charge_body("o-1").to_string();
        // (Idempotency-Key, body): each is answered 400 and charges nothing.
        let cases: &[(Option<&str>, &str)] = &[
            (None, &valid),
            (Some(" "), &valid),
            (Some("k"), "not json"),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1"}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": 120.5}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": "-1.00", "currency": "EUR"}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": "0", "currency": "EUR"}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": "lots", "currency": "EUR"}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": "1.00"}"#),
            (Some("k"), r#"{"order_id": "o-1", "customer_id": "c-1", "amount": "1.00", "currency": "eur"}"#),
        ];
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        for (key, body) in cases {
            assert_eq!(client.post(*key, body).await.unwrap(), 400, "key {key:?}, body {body}");
        }
        assert_eq!(provider.ledger(), []);
        assert_eq!(provider.requests(), BTreeMap::from([(400, cases.len() as u64)]));
    }

    /// Scripts and the statuses of the order's next charges. Each runs on a
    /// provider that would otherwise refuse every order: scripts win.
    const SCRIPTS: &[(Script, &[u16])] = &[
        (Script::FailTimes { times: 2 }, &[503, 503, 201, 409]),
        (Script::FailTimes { times: 0 }, &[201, 409]),
        (Script::Reject, &[400, 400, 400]),
        (Script::Hang { times: 1, delay: Duration::from_millis(50) }, &[201, 409]),
        (Script::FailLate { delay: Duration::from_millis(50) }, &[502, 201, 409]),
    ];

    fn always_refusing() -> Faults {
        Faults { permanent_pct: 100, ..Faults::default() }
    }

    #[tokio::test]
    async fn scripts_in_process() {
        let provider = FakeProvider::start(always_refusing()).await;
        let client = Client::of(&provider);
        for (i, (script, expected)) in SCRIPTS.iter().enumerate() {
            let order = format!("o-{i}");
            provider.script(&order, *script);
            check(&client, &order, expected).await;
        }
    }

    #[tokio::test]
    async fn scripts_over_http() {
        let provider = FakeProvider::start(always_refusing()).await;
        let client = Client::of(&provider);
        for (i, (script, expected)) in SCRIPTS.iter().enumerate() {
            let order = format!("o-{i}");
            assert_eq!(client.put_script(&order, &serde_json::to_string(script).unwrap()).await, 200);
            check(&client, &order, expected).await;
        }
    }

    #[tokio::test]
    async fn scripts_have_a_documented_json_form() {
        let cases = [
            (r#"{"kind": "reject"}"#, 200),
            (r#"{"kind": "hang", "times": 1, "delay_ms": 3000}"#, 200),
            (r#"{"kind": "fail_late", "delay_ms": 10}"#, 200),
            (r#"{"kind": "fail_times", "times": 2}"#, 200),
            (r#"{"kind": "hang", "times": 1}"#, 400),
            (r#"{"kind": "explode"}"#, 400),
            ("nonsense", 400),
        ];
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        for (script, expected) in cases {
            assert_eq!(client.put_script("o-1", script).await, expected, "{script}");
        }
        // The last valid one holds.
        check(&client, "o-1", &[503, 503, 201, 409]).await;
    }

    /// Waits until `order`'s charge under its key has `status`.
    async fn until_status(client: &Client, order: &str, status: &str) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while client.get(&format!("/charges/event-{order}")).await["status"] != status {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the charge of {order} never became {status}"));
    }

    #[tokio::test]
    async fn a_hang_outlasts_the_client_timeout_and_is_pending_until_it_charges() {
        let provider = FakeProvider::start(Faults::default()).await;
        provider.script("o-1", Script::Hang { times: 1, delay: Duration::from_secs(1) });
        let impatient = Client::with_timeout(&provider, Duration::from_millis(300));
        let err = impatient.charge("o-1").await.unwrap_err();
        assert!(err.is_timeout(), "expected a client timeout, got {err}");
        let client = Client::of(&provider);
        // Still processing: a conflict, and the key's charge says so.
        check(&client, "o-1", &[409]).await;
        let status = client.get("/charges/event-o-1").await;
        assert_eq!(status["status"], "pending", "{status}");
        assert_eq!(provider.ledger(), []);
        until_status(&client, "o-1", "succeeded").await;
        check(&client, "o-1", &[409]).await;
        assert_eq!(provider.ledger(), [ledger_entry("o-1", 3)]);
    }

    #[tokio::test]
    async fn a_charge_that_fails_late_frees_its_key() {
        let provider = FakeProvider::start(Faults::default()).await;
        provider.script("o-1", Script::FailLate { delay: Duration::from_secs(1) });
        let impatient = Client::with_timeout(&provider, Duration::from_millis(300));
        assert!(impatient.charge("o-1").await.unwrap_err().is_timeout());
        let client = Client::of(&provider);
        check(&client, "o-1", &[409]).await;
        until_status(&client, "o-1", "failed").await;
        assert_eq!(provider.ledger(), []);
        // The failed attempt is over: the next request charges.
        check(&client, "o-1", &[201, 409]).await;
        assert_eq!(client.get("/charges/event-o-1").await["status"], "succeeded");
        assert_eq!(provider.ledger(), [ledger_entry("o-1", 4)]);
    }

    #[tokio::test]
    async fn a_key_reused_with_another_body_is_a_conflict_and_charges_nothing() {
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        check(&client, "o-1", &[201]).await;
        let mut other = charge_body("o-1");
        other["amount"] = json!("99.00");
        assert_eq!(client.post(Some("event-o-1"), &other.to_string()).await.unwrap(), 409);
        let status = client.get("/charges/event-o-1").await;
        assert_eq!((&status["amount"], &status["status"]), (&json!("120.50"), &json!("succeeded")));
        assert_eq!(provider.ledger(), [ledger_entry("o-1", 2)]);
    }

    #[tokio::test]
    async fn keys_are_forgotten_after_their_time_to_live() {
        let ttl = Duration::from_millis(300);
        let provider = FakeProvider::start(Faults { key_ttl: Some(ttl), ..Faults::default() }).await;
        let client = Client::of(&provider);
        check(&client, "o-1", &[201, 409]).await;
        let answer = client.http.get(format!("{}/charges/event-unknown", client.url)).send().await.unwrap();
        assert_eq!(answer.status(), 404);
        tokio::time::sleep(ttl).await;
        let answer = client.http.get(format!("{}/charges/event-o-1", client.url)).send().await.unwrap();
        assert_eq!(answer.status(), 404, "a forgotten key is unknown");
        // What the idempotency window of replays is for: the same key charges twice.
        check(&client, "o-1", &[201]).await;
        assert_eq!(provider.charges_for("o-1").len(), 2);
    }

    #[tokio::test]
    async fn stopping_answers_waiting_requests_and_closes_the_port() {
        let provider = FakeProvider::start(Faults::default()).await;
        provider.script("o-1", Script::Hang { times: 1, delay: Duration::from_secs(60) });
        let client = Client::of(&provider);
        let waiting = tokio::spawn(async move { client.charge("o-1").await });
        tokio::time::timeout(Duration::from_secs(10), async {
            while provider.requests().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the request reaches the provider");
        let client = Client::of(&provider);
        tokio::time::timeout(Duration::from_secs(10), provider.stop()).await.expect("stop is prompt");
        assert_eq!(waiting.await.unwrap().unwrap(), 503);
        assert!(client.charge("o-2").await.unwrap_err().is_connect());
    }

    #[tokio::test]
    async fn random_faults_follow_the_plan() {
        let faults = Faults {
            transient_pct: 40,
            transient_max_failures: 3,
            permanent_pct: 20,
            slow_pct: 20,
            slow: Duration::from_millis(20),
            seed: 7,
            latency: Duration::from_millis(5),
            key_ttl: None,
        };
        let provider = FakeProvider::start(faults.clone()).await;
        let client = Client::of(&provider);
        let mut kinds = std::collections::HashSet::new();
        for i in 0..40 {
            let order = format!("order-{i}");
            let fault = faults.plan(&order);
            let expected = match fault {
                OrderFault::Healthy | OrderFault::Slow => vec![201, 409],
                OrderFault::Transient { failures, status } => {
                    let mut statuses = vec![status; failures as usize];
                    statuses.extend([201, 409]);
                    statuses
                }
                OrderFault::Permanent => vec![400, 400],
            };
            check(&client, &order, &expected).await;
            kinds.insert(std::mem::discriminant(&fault));
        }
        assert_eq!(kinds.len(), 4, "40 orders meet every kind of fault");
    }

    #[test]
    fn the_plan_is_deterministic_per_seed_and_keeps_the_shares() {
        let faults = Faults {
            transient_pct: 20,
            transient_max_failures: 4,
            permanent_pct: 5,
            slow_pct: 5,
            slow: Duration::from_secs(3),
            seed: 42,
            latency: Duration::ZERO,
            key_ttl: None,
        };
        let orders: Vec<String> = (0..10_000).map(|i| format!("order-{i}")).collect();
        let plan = |faults: &Faults| orders.iter().map(|o| faults.plan(o)).collect::<Vec<_>>();
        let planned = plan(&faults);
        assert_eq!(planned, plan(&faults.clone()));
        assert_ne!(planned, plan(&Faults { seed: 43, ..faults.clone() }));

        let kind = |f: &OrderFault| match f {
            OrderFault::Healthy => "healthy",
            OrderFault::Transient { .. } => "transient",
            OrderFault::Permanent => "permanent",
            OrderFault::Slow => "slow",
        };
        for (name, expected_pct) in [("transient", 20.0), ("permanent", 5.0), ("slow", 5.0), ("healthy", 70.0)] {
            let got_pct = planned.iter().filter(|f| kind(f) == name).count() as f64 / 100.0;
            assert!(
                (got_pct - expected_pct).abs() < 1.5,
                "{name}: {got_pct}% of orders, expected about {expected_pct}%"
            );
        }
        let failures: std::collections::BTreeSet<u32> = planned
            .iter()
            .filter_map(|f| match f {
                OrderFault::Transient { failures, .. } => Some(*failures),
                _ => None,
            })
            .collect();
        assert_eq!(failures, (1..=4).collect());
    }

    #[test]
    fn fault_shares_add_up_to_at_most_100() {
        let cases = [((20, 5, 5), true), ((0, 0, 100), true), ((50, 30, 20), true), ((50, 30, 21), false)];
        for ((transient_pct, permanent_pct, slow_pct), valid) in cases {
            let faults = Faults { transient_pct, permanent_pct, slow_pct, ..Faults::default() };
            assert_eq!(faults.validate().is_ok(), valid, "{faults:?}");
        }
    }

    #[tokio::test]
    async fn the_ledger_and_request_counts_are_served_as_json() {
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        check(&client, "o-1", &[201, 409]).await;
        check(&client, "o-2", &[201]).await;
        let expected = json!([
            {
                "idempotency_key": "event-o-1",
                "order_id": "o-1",
                "customer_id": "customer-o-1",
                "amount": "120.50",
                "currency": "EUR",
                "requests": 2,
            },
            {
                "idempotency_key": "event-o-2",
                "order_id": "o-2",
                "customer_id": "customer-o-2",
                "amount": "120.50",
                "currency": "EUR",
                "requests": 1,
            },
        ]);
        assert_eq!(client.get("/ledger").await, expected);
        assert_eq!(client.get("/requests").await, json!({ "201": 2, "409": 1 }));
    }

    #[tokio::test]
    async fn an_outage_is_switched_on_and_off_over_http() {
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        let cases: &[(&str, u16, &[u16])] = &[
            ("on", 200, &[503, 503]),
            ("off", 200, &[201]),
            ("true", 200, &[503]),
            ("false\n", 200, &[201]),
            ("maybe", 400, &[201]),
        ];
        for (i, (body, status, charges)) in cases.iter().enumerate() {
            assert_eq!(client.put("/outage", body).await.0, *status, "{body}");
            for (j, expected) in charges.iter().enumerate() {
                assert_eq!(client.charge(&format!("o-{i}-{j}")).await.unwrap(), *expected, "{body}");
            }
        }
    }

    #[tokio::test]
    async fn the_mix_of_faults_changes_over_http_and_stays_valid() {
        let provider = FakeProvider::start(Faults::default()).await;
        let client = Client::of(&provider);
        assert_eq!(client.charge("before").await.unwrap(), 201);
        let cases = [
            (r#"{"permanent_pct": 100}"#, 200, 100, 0),
            (r#"{"transient_pct": 50}"#, 400, 100, 0),
            (r#"{"permanent_pct": 0, "transient_pct": 30, "latency_ms": 5}"#, 200, 0, 30),
            (r#"{"typo_pct": 1}"#, 400, 0, 30),
            ("nonsense", 400, 0, 30),
        ];
        for (change, status, permanent, transient) in cases {
            assert_eq!(client.put("/faults", change).await.0, status, "{change}");
            let now = client.get("/faults").await;
            assert_eq!(
                (now["permanent_pct"].as_u64(), now["transient_pct"].as_u64()),
                (Some(permanent), Some(transient))
            );
            assert_eq!(provider.faults().permanent_pct, permanent as u8);
        }
        assert_eq!(provider.faults().latency, Duration::from_millis(5));
        // The random mix, changed, applies from the next order on.
        client.put("/faults", r#"{"permanent_pct": 100, "transient_pct": 0}"#).await;
        assert_eq!(client.charge("after").await.unwrap(), 400);
    }
}
