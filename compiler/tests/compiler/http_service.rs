//! The HTTP service example under a short loopback load test: every request
//! answered, the answer equal to a direct run of the same program, memory
//! flat after warm-up, and a bad request a 400 rather than a crash.

#[allow(dead_code)]
#[path = "../../examples/http_service.rs"]
mod example;

use example::{fixture_program, load_test, router, Client, RunResponse, Service};

#[test]
fn concurrent_clients_get_the_programs_answers() {
    let program = fixture_program().expect("program");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let report = rt.block_on(load_test(program.clone(), 2, 4, 60)).expect("load test");
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.latencies.len(), 240);
    let growth = report.rss_after.saturating_sub(report.rss_after_warmup);
    assert!(growth < 16 << 20, "resident memory grew by {growth} bytes under load");

    // The served answer is the program's: compare with a direct run.
    let sample: RunResponse = report.sample.expect("a sample response");
    let input: Vec<f32> = (0..64).map(|i| ((i as f64) * 0.37).sin() as f32).collect();
    let mut session = program.session().expect("session");
    let direct = session.run(&[kiln_runtime::Tensor::from_f32(&[4, 16], &input).view()]).expect("run").to_tensors();
    let want = direct[0].to_f32().expect("f32 output");
    assert_eq!(sample.outputs[0].shape, vec![4, 10]);
    // JSON carries the f32 values as decimals; they come back as the same f32s.
    let served: Vec<f32> = sample.outputs[0].data.iter().map(|&v| v as f32).collect();
    assert_eq!(served, want);

    // A wrong shape is refused with a 400 and a message; the service goes on.
    rt.block_on(async {
        let svc = Service::new(program, 1).expect("service");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, router(svc)).await });
        let mut c = Client::connect(addr).await.expect("connect");
        let bad = br#"{"inputs": [{"dtype": "f32", "shape": [3, 16], "data": [0.0]}]}"#;
        let (status, body) = c.post(bad).await.expect("post");
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        let wrong_shape = serde_json::to_vec(
            &serde_json::json!({"inputs": [{"dtype": "f32", "shape": [5, 16], "data": vec![0.0; 80]}]}),
        )
        .unwrap();
        let (status, body) = c.post(&wrong_shape).await.expect("post");
        assert_eq!(status, 400);
        assert!(String::from_utf8_lossy(&body).contains("error"), "{}", String::from_utf8_lossy(&body));
        let (status, _) = c.post(b"not json").await.expect("post");
        assert_eq!(status, 400);
        let good =
            serde_json::to_vec(&serde_json::json!({"inputs": [{"dtype": "f32", "shape": [4, 16], "data": input}]}))
                .unwrap();
        let (status, _) = c.post(&good).await.expect("post");
        assert_eq!(status, 200, "the service keeps serving after bad requests");
        server.abort();
    });
}
