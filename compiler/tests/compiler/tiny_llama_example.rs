//! Runs the `tiny_llama` example (greedy decoding through a static KV cache
//! kept as session state): its tokens must be eager PyTorch's, in both IR flavours.

#[path = "../../examples/tiny_llama.rs"]
mod tiny_llama;

#[test]
fn greedy_tokens_match_eager_in_both_flavours() {
    for flavour in ["training", "aten"] {
        let (tokens, eager) = tiny_llama::run(flavour).unwrap_or_else(|e| panic!("{flavour}: {e}"));
        assert!(eager.len() >= 8, "the fixture generates {} tokens", eager.len());
        assert_eq!(tokens, eager, "{flavour}: kiln's greedy tokens differ from eager's");
    }
}
