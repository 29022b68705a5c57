//! An HTTP inference service embedding the runtime (axum on tokio): one
//! `Program` shared by a fixed pool of worker sessions, JSON in and out,
//! and a loopback load test with concurrent keep-alive clients.
//!
//! ```text
//! cargo run --release -p kiln-compiler --example http_service -- [--artifact model.kiln] [--addr 127.0.0.1:8080] [--workers 2]
//! cargo run --release -p kiln-compiler --example http_service -- --load-test [--clients 8] [--requests 500] [--workers 2]
//! ```
//! Without `--artifact` it compiles the `mlp` fixture at start-up.
//!
//! - `GET /v1/model`: the inputs and outputs (name, dtype, shape).
//! - `POST /v1/run` with `{"inputs": [{"dtype": "f32", "shape": [4, 16], "data": [...]}]}`:
//!   `{"outputs": [{"name", "dtype", "shape", "data"}], "run_us": n}`; a
//!   request the program refuses (wrong shape, bad JSON) is a 400 with
//!   `{"error": "..."}`, never a crash.
//!
//! Sessions are checked out of the pool for one run (a semaphore bounds the
//! waiters; the run itself happens on tokio's blocking threads), so the
//! arena of each session is allocated once and reused by every request.
//! `compiler/tests/compiler/http_service.rs` runs the load test briefly.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_runtime::{DType, Program, Session, Tensor};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// A tensor on the wire: numbers in row-major order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WireTensor {
    #[serde(default)]
    pub name: Option<String>,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RunRequest {
    pub inputs: Vec<WireTensor>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RunResponse {
    pub outputs: Vec<WireTensor>,
    pub run_us: u64,
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

type Reply<T> = Result<Json<T>, (StatusCode, Json<ErrorBody>)>;

fn bad_request(error: impl Into<String>) -> (StatusCode, Json<ErrorBody>) {
    (StatusCode::BAD_REQUEST, Json(ErrorBody { error: error.into() }))
}

/// The shared program and its pool of sessions.
pub struct Service {
    program: Arc<Program>,
    sessions: Mutex<Vec<Session>>,
    /// One permit per idle session: a request waits here, not in a spin.
    permits: Semaphore,
}

impl Service {
    pub fn new(program: Arc<Program>, workers: usize) -> Result<Arc<Service>, String> {
        let sessions =
            (0..workers.max(1)).map(|_| program.session().map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
        Ok(Arc::new(Service { program, sessions: Mutex::new(sessions), permits: Semaphore::new(workers.max(1)) }))
    }

    /// Runs one request on an idle session.
    async fn run(self: &Arc<Self>, inputs: Vec<Tensor>) -> Result<RunResponse, String> {
        let _permit = self.permits.acquire().await.map_err(|e| e.to_string())?;
        let mut session = self.sessions.lock().map_err(|_| "session pool poisoned")?.pop().ok_or("no idle session")?;
        let (session, result) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
            let result = session.run(&views).map(|outs| {
                let outputs = (0..outs.len()).map(|i| to_wire(Some(outs.name(i)), outs.get(i))).collect();
                RunResponse { outputs, run_us: started.elapsed().as_micros() as u64 }
            });
            (session, result.map_err(|e| e.to_string()))
        })
        .await
        .map_err(|e| format!("worker failed: {e}"))?;
        self.sessions.lock().map_err(|_| "session pool poisoned")?.push(session);
        result
    }
}

fn dtype_name(d: DType) -> String {
    d.to_string()
}

/// Every output dtype as JSON numbers.
fn to_wire(name: Option<&str>, t: kiln_runtime::TensorView<'_>) -> WireTensor {
    let data = kiln_runtime::elements_f64(&t);
    WireTensor { name: name.map(str::to_string), dtype: dtype_name(t.dtype), shape: t.shape.to_vec(), data }
}

fn from_wire(w: &WireTensor) -> Result<Tensor, String> {
    let count = w.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or("shape too large")?;
    if count != w.data.len() {
        return Err(format!("shape {:?} holds {count} elements, data has {}", w.shape, w.data.len()));
    }
    match w.dtype.as_str() {
        "f32" => Ok(Tensor::from_f32(&w.shape, &w.data.iter().map(|&v| v as f32).collect::<Vec<_>>())),
        "i64" => Ok(Tensor::from_i64(&w.shape, &w.data.iter().map(|&v| v as i64).collect::<Vec<_>>())),
        other => Err(format!("dtype `{other}` is not served (f32, i64)")),
    }
}

async fn model(State(svc): State<Arc<Service>>) -> Json<serde_json::Value> {
    let io = |v: Vec<kiln_runtime::IoInfo>| -> Vec<serde_json::Value> {
        v.into_iter()
            .map(|i| serde_json::json!({"name": i.name, "dtype": dtype_name(i.dtype), "shape": i.shape}))
            .collect()
    };
    Json(serde_json::json!({"inputs": io(svc.program.inputs()), "outputs": io(svc.program.outputs())}))
}

async fn run(
    State(svc): State<Arc<Service>>,
    body: Result<Json<RunRequest>, axum::extract::rejection::JsonRejection>,
) -> Reply<RunResponse> {
    let Json(req) = body.map_err(|e| bad_request(e.body_text()))?;
    let inputs = req.inputs.iter().map(from_wire).collect::<Result<Vec<_>, _>>().map_err(bad_request)?;
    svc.run(inputs).await.map(Json).map_err(bad_request)
}

pub fn router(svc: Arc<Service>) -> Router {
    Router::new().route("/v1/model", get(model)).route("/v1/run", post(run)).with_state(svc)
}

/// Compiles the `mlp` fixture (4×16 → 4×10) to a temporary artifact and loads it.
pub fn fixture_program() -> Result<Arc<Program>, String> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mlp/aten.pt2");
    let artifact = std::env::temp_dir().join(format!("kiln-http-service-{}.kiln", std::process::id()));
    kiln_compiler::compile_file(&fixture, &artifact, &kiln_compiler::CompileOptions::default())
        .map_err(|e| format!("compile {}: {e}", fixture.display()))?;
    let program = Program::load(&artifact).map_err(|e| e.to_string());
    std::fs::remove_file(&artifact).ok();
    program
}

/// What a load test measured.
#[derive(Debug)]
pub struct LoadReport {
    pub requests: usize,
    pub errors: usize,
    pub elapsed: Duration,
    /// Request latencies seen by the clients, sorted.
    pub latencies: Vec<Duration>,
    /// Resident memory after the warm-up round and after the whole load (bytes).
    pub rss_after_warmup: u64,
    pub rss_after: u64,
    /// The first response, to check against a direct run.
    pub sample: Option<RunResponse>,
}

impl LoadReport {
    pub fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len().max(1) as f64 - 1.0) * p).round() as usize;
        self.latencies.get(i.min(self.latencies.len().saturating_sub(1))).copied().unwrap_or_default()
    }
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Resident set size from `/proc/self/statm` (0 where there is none).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// One keep-alive HTTP/1.1 connection sending `POST /v1/run` requests.
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        // A request is one small write; Nagle's algorithm would hold it for
        // the server's delayed ACK (~40 ms a request).
        stream.set_nodelay(true)?;
        Ok(Client { reader: BufReader::new(stream) })
    }

    /// The status and body of one request.
    pub async fn post(&mut self, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut request = format!(
            "POST /v1/run HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.reader.get_mut().write_all(&request).await?;
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).await?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).await?;
        Ok((status, body))
    }
}

/// Serves `program` on a loopback port and drives it with `clients`
/// concurrent connections of `requests` requests each (after one warm-up
/// round per client).
pub async fn load_test(
    program: Arc<Program>,
    workers: usize,
    clients: usize,
    requests: usize,
) -> Result<LoadReport, String> {
    let svc = Service::new(program, workers)?;
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move { axum::serve(listener, router(svc)).await });

    let input = WireTensor {
        name: None,
        dtype: "f32".into(),
        shape: vec![4, 16],
        data: (0..64).map(|i| ((i as f64) * 0.37).sin()).collect(),
    };
    let body = Arc::new(serde_json::to_vec(&RunRequest { inputs: vec![input] }).map_err(|e| e.to_string())?);
    let mut conns = Vec::with_capacity(clients);
    let mut sample = None;
    for _ in 0..clients {
        let mut c = Client::connect(addr).await.map_err(|e| e.to_string())?;
        let (status, reply) = c.post(&body).await.map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("warm-up request failed with {status}: {}", String::from_utf8_lossy(&reply)));
        }
        if sample.is_none() {
            sample = Some(serde_json::from_slice::<RunResponse>(&reply).map_err(|e| e.to_string())?);
        }
        conns.push(c);
    }
    let rss_after_warmup = rss_bytes();
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let body = Arc::clone(&body);
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(requests);
                let mut errors = 0;
                for _ in 0..requests {
                    let t = Instant::now();
                    match c.post(&body).await {
                        Ok((200, _)) => lat.push(t.elapsed()),
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::with_capacity(clients * requests), 0);
    for t in tasks {
        let (lat, err) = t.await.map_err(|e| e.to_string())?;
        latencies.extend(lat);
        errors += err;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    server.abort();
    Ok(LoadReport {
        requests: clients * requests,
        errors,
        elapsed,
        latencies,
        rss_after_warmup,
        rss_after: rss_bytes(),
        sample,
    })
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{name} needs a value")),
        None => Ok(default),
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = (|| -> Result<(), String> {
        let workers = arg(&args, "--workers", 2usize)?;
        let program = match args.iter().position(|a| a == "--artifact") {
            Some(i) => Program::load(PathBuf::from(args.get(i + 1).ok_or("--artifact needs a path")?))
                .map_err(|e| e.to_string())?,
            None => fixture_program()?,
        };
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
        if args.iter().any(|a| a == "--load-test") {
            let clients = arg(&args, "--clients", 8usize)?;
            let requests = arg(&args, "--requests", 500usize)?;
            let r = rt.block_on(load_test(program, workers, clients, requests))?;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "{} requests from {clients} clients over {workers} sessions: {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, {} errors; RSS {:.1} MiB after warm-up, {:.1} MiB after",
                r.requests,
                r.throughput(),
                ms(r.percentile(0.5)),
                ms(r.percentile(0.99)),
                r.errors,
                r.rss_after_warmup as f64 / 1048576.0,
                r.rss_after as f64 / 1048576.0
            );
            return if r.errors == 0 { Ok(()) } else { Err(format!("{} requests failed", r.errors)) };
        }
        let addr = arg(&args, "--addr", "127.0.0.1:8080".to_string())?;
        rt.block_on(async {
            let svc = Service::new(program, workers)?;
            let listener = TcpListener::bind(&addr).await.map_err(|e| format!("bind {addr}: {e}"))?;
            println!("serving on http://{addr} (POST /v1/run, GET /v1/model), {workers} sessions");
            axum::serve(listener, router(svc)).await.map_err(|e| e.to_string())
        })
    })();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
