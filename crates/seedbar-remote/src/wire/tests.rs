use super::*;

fn read(api: Api, stream: &str) -> Result<Vec<Piece>, String> {
    let mut reader = Reader::new(api);
    let mut pieces = Vec::new();
    // Cut in awkward places, as a network would.
    for chunk in stream.as_bytes().chunks(7) {
        pieces.extend(reader.push(chunk)?);
    }
    pieces.extend(reader.close()?);
    Ok(pieces)
}

fn finish(end: End, prompt: usize, completion: usize) -> Piece {
    Piece::Finish(Finish {
        end,
        prompt_tokens: Some(prompt),
        completion_tokens: Some(completion),
    })
}

#[test]
fn an_openai_stream_gives_text_thinking_and_usage() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
        ": a comment\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"Par\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"is\"},\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    );
    assert_eq!(
        read(Api::OpenAi, stream).unwrap(),
        vec![
            Piece::Reasoning("hm".into()),
            Piece::Text("Par".into()),
            Piece::Text("is".into()),
            finish(End::Length, 9, 3),
        ]
    );
}

#[test]
fn a_character_cut_between_two_reads_comes_whole() {
    // Cut every 7 bytes, "猫🐈" falls across reads in the middle of its characters.
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"猫🐈 é\"},\"finish_reason\":\"stop\"}]}\n",
        "data: [DONE]\n",
    );
    let pieces = read(Api::OpenAi, stream).unwrap();
    assert_eq!(pieces[0], Piece::Text("猫🐈 é".into()));
}

#[test]
fn an_openai_streams_call_fragments_are_joined() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",",
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,",
        "\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n",
        "data: [DONE]\n",
    );
    let pieces = read(Api::OpenAi, stream).unwrap();
    let Piece::ToolCall(call) = &pieces[0] else {
        panic!("{pieces:?}")
    };
    assert_eq!(
        (
            call.id.as_str(),
            call.name.as_str(),
            call.arguments.as_str()
        ),
        ("call_1", "get_weather", "{\"city\":\"Paris\"}")
    );
    assert!(matches!(
        pieces[1],
        Piece::Finish(Finish {
            end: End::ToolCalls,
            ..
        })
    ));
}

#[test]
fn an_error_in_the_stream_and_a_cut_stream_are_errors() {
    let error = "data: {\"error\":{\"message\":\"out of memory\",\"code\":500}}\n";
    assert_eq!(read(Api::OpenAi, error).unwrap_err(), "out of memory");
    let cut = "data: {\"choices\":[{\"delta\":{\"content\":\"Par\"}}]}\n";
    assert!(read(Api::OpenAi, cut)
        .unwrap_err()
        .contains("before the reply finished"));
    assert!(read(Api::Ollama, "{\"error\":\"model 'x' not found\"}\n")
        .unwrap_err()
        .contains("not found"));
    assert!(read(Api::Ollama, "<html>\n")
        .unwrap_err()
        .contains("not JSON"));
}

#[test]
fn an_ollama_stream_gives_text_thinking_calls_and_counts() {
    let stream = concat!(
        "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"hm\"},\"done\":false}\n",
        "{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n",
        "{\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":",
        "[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},\"done\":false}\n",
        "{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,",
        "\"done_reason\":\"stop\",\"prompt_eval_count\":5,\"eval_count\":2}",
    );
    let pieces = read(Api::Ollama, stream).unwrap();
    assert_eq!(pieces[0], Piece::Reasoning("hm".into()));
    assert_eq!(pieces[1], Piece::Text("Hi".into()));
    assert_eq!(
        pieces[2],
        Piece::ToolCall(ToolCall::new(0, "f".into(), "{\"a\":1}".into()))
    );
    assert_eq!(pieces[3], finish(End::ToolCalls, 5, 2));
}

#[test]
fn requests_carry_the_seed_and_settings() {
    let remote = Remote::new("r", "http://h:1", Api::OpenAi, "up-model");
    let mut ask = Ask::new(
        AskPrompt::Chat {
            messages: vec![ChatMessage::new("user", "hi")],
            tools: None,
        },
        7,
    );
    ask.sampling.temperature = 0.5;
    ask.sampling.top_k = 40;
    ask.max_tokens = Some(12);
    ask.shape = Some(Shape::JsonSchema(json!({"type": "object"})));
    let (route, body) = request(&remote, &ask);
    assert_eq!(route, "/v1/chat/completions");
    assert_eq!(body["seed"], 7);
    assert_eq!(body["model"], "up-model");
    assert_eq!(body["top_k"], 40);
    assert_eq!(body["max_tokens"], 12);
    assert!(body.get("min_p").is_none());
    assert_eq!(
        body["response_format"]["json_schema"]["schema"]["type"],
        "object"
    );

    let remote = Remote::new("r", "http://h:1", Api::Ollama, "llama3");
    ask.prompt = AskPrompt::FillInTheMiddle {
        prefix: "def f(".into(),
        suffix: "\n".into(),
    };
    let (route, body) = request(&remote, &ask);
    assert_eq!(route, "/api/generate");
    assert_eq!(body["options"]["seed"], 7);
    assert_eq!(body["options"]["num_predict"], 12);
    assert_eq!(body["suffix"], "\n");
    assert_eq!(body["format"]["type"], "object");
}

#[test]
fn a_calls_arguments_go_out_as_each_protocol_wants() {
    let mut message = ChatMessage::new("assistant", "");
    message.tool_calls = Some(json!([{"id": "call_1", "type": "function",
        "function": {"name": "f", "arguments": {"a": 1}}}]));
    assert_eq!(
        openai_message(&message)["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(
        ollama_message(&message)["tool_calls"][0]["function"]["arguments"]["a"],
        1
    );
}
