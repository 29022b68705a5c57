//! `kiln run --node I/N --coordinator ADDR`: one process of a run over
//! several hosts. Node 0 serves the coordination store at ADDR for the run's
//! lifetime; the others reach it there. The session then executes only the
//! partitions on this host's devices and exchanges result pieces through the
//! store (README, "Several hosts").

use kiln_runtime::pjrt::distributed::{CoordinationService, Distributed, KvStore, RemoteKvStore};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Default)]
pub struct HostArgs {
    /// This process's place in a run over several hosts: `I/N` (node I of N,
    /// from 0). Every process runs the same artifact with the same flags but
    /// its own node.
    #[arg(long, value_name = "I/N", value_parser = parse_node, requires = "coordinator")]
    pub node: Option<(u32, u32)>,
    /// `HOST:PORT` of the run's coordination store: node 0 listens there
    /// (`0.0.0.0:PORT` to accept every interface), the others connect.
    #[arg(long, value_name = "HOST:PORT", requires = "node")]
    pub coordinator: Option<String>,
    /// Names the session, the same on every host (else a process's n-th
    /// session pairs with the others' n-th).
    #[arg(long, value_name = "NAME", requires = "node")]
    pub session: Option<String>,
    /// How long to wait for the coordinator and for a peer's launch or result
    /// pieces, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, requires = "node")]
    pub peer_timeout: u64,
}

fn parse_node(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`{s}` is not a node such as 0/2 (node I of N, I below N)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (u32, u32) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// What a distributed run holds for its lifetime: the options' `Distributed`
/// and, on node 0, the service the others reach.
pub struct Hosts {
    pub distributed: Distributed,
    pub addr: SocketAddr,
    _service: Option<CoordinationService>,
}

impl HostArgs {
    /// `None` without `--node`. Node 0 starts the service; another node
    /// checks it can reach it now (a clear error rather than a hang at the
    /// first exchange).
    pub fn start(&self) -> Result<Option<Hosts>, String> {
        let (Some((node, nodes)), Some(coordinator)) = (self.node, self.coordinator.as_deref()) else {
            return Ok(None);
        };
        let timeout = Duration::from_secs(self.peer_timeout);
        let (store, addr, service): (Arc<dyn KvStore>, SocketAddr, Option<CoordinationService>) = if node == 0 {
            let service = CoordinationService::start(coordinator)
                .map_err(|e| format!("--coordinator {coordinator}: cannot listen there: {e}"))?;
            let addr = service.addr();
            (Arc::clone(service.store()) as Arc<dyn KvStore>, addr, Some(service))
        } else {
            let addr = coordinator
                .to_socket_addrs()
                .map_err(|e| format!("--coordinator {coordinator}: {e}"))?
                .next()
                .ok_or_else(|| format!("--coordinator {coordinator}: no address"))?;
            let mut remote = RemoteKvStore::new(addr);
            remote.connect_timeout = timeout;
            match remote.try_get("kiln/cli/probe") {
                Ok(_) | Err(kiln_runtime::pjrt::distributed::KvError::NotFound(_)) => {}
                Err(e) => return Err(format!("node {node}: {e}")),
            }
            (Arc::new(remote) as Arc<dyn KvStore>, addr, None)
        };
        let distributed =
            Distributed { timeout, session: self.session.clone(), ..Distributed::new(node, nodes, store) };
        distributed.validate()?;
        eprintln!("node {node} of {nodes}, coordination store at {addr}");
        Ok(Some(Hosts { distributed, addr, _service: service }))
    }
}

/// Where each node leaves its outcome for node 0.
fn done_key(node: u32) -> String {
    format!("kiln/cli/done/{node}")
}

impl Hosts {
    /// Ends this process's part of the run with its `result`: another node
    /// reports it to node 0; node 0 (whose process serves the store) waits
    /// for every other node's report before it returns, so it does not take
    /// the store away from a peer still fetching pieces, and fails naming a
    /// peer that failed or did not finish within the peer timeout.
    pub fn finish(self, result: Result<(), String>) -> Result<(), String> {
        let d = &self.distributed;
        if d.node_id != 0 {
            let outcome = match &result {
                Ok(()) => String::new(),
                Err(e) => e.clone(),
            };
            let reported = d.store.put_for_readers(&done_key(d.node_id), outcome.as_bytes(), 1);
            return result.and(reported.map_err(|e| format!("node {}: cannot report to node 0: {e}", d.node_id)));
        }
        let mut failed = Vec::new();
        for peer in 1..d.num_nodes {
            match d.store.get(&done_key(peer), d.timeout) {
                Ok(v) if v.is_empty() => {}
                Ok(v) => failed.push(format!("node {peer} failed: {}", String::from_utf8_lossy(&v))),
                Err(e) => failed.push(format!("node {peer} did not finish: {e}")),
            }
        }
        match (result, failed.is_empty()) {
            (r, true) => r,
            (Ok(()), false) => Err(failed.join("; ")),
            (Err(e), false) => Err(format!("{e}; {}", failed.join("; "))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_specs() {
        assert_eq!(parse_node("1/2"), Ok((1, 2)));
        assert_eq!(parse_node(" 0 / 8"), Ok((0, 8)));
        for bad in ["2/2", "0/0", "1", "a/2", "1/-2"] {
            assert!(parse_node(bad).unwrap_err().contains("is not a node such as 0/2"), "{bad}");
        }
    }

    #[test]
    fn an_unreachable_coordinator_is_a_clear_error() {
        // A port nobody listens at: bind one and drop it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let args = HostArgs {
            node: Some((1, 2)),
            coordinator: Some(format!("127.0.0.1:{port}")),
            session: None,
            peer_timeout: 1,
        };
        let err = args.start().err().expect("unreachable");
        assert!(err.contains("node 1: key-value store: cannot reach the coordination service at 127.0.0.1"), "{err}");
        let args = HostArgs { node: Some((0, 2)), session: Some("a b".into()), ..args };
        let err = args.start().err().expect("bad name");
        assert!(err.contains("session name `a b`"), "{err}");
    }
}
