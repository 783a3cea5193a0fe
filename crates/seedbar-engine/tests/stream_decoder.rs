//! The streaming decoder on the default model's tokenizer (byte-level BPE): a long reply's
//! deltas, each decoded from a short window of recent ids, join into the text of all its
//! ids, in whole characters only.

use seedbar_engine::{tokenizer::StreamDecoder, Model};

#[test]
fn a_long_reply_streams_its_whole_text_in_whole_characters() {
    let model = Model::load(&seedbar_dev::default_model_path()).unwrap();
    let line = "naïve café, Ελληνικά, 日本語のテキスト, 😀🎉👩‍👩‍👧‍👦 🇫🇷 e\u{301}, `x >> 2`\n";
    let ids = model.tokenizer.encode(&line.repeat(60)).unwrap();
    assert!(ids.len() > 1500, "{}", ids.len());
    let mut stream = StreamDecoder::default();
    let mut pieces: Vec<String> = (1..=ids.len())
        .map(|end| stream.push(&model.tokenizer, &ids[..end]).unwrap())
        .collect();
    pieces.push(stream.finish(&model.tokenizer, &ids).unwrap());
    assert_eq!(pieces.concat(), model.tokenizer.decode(&ids).unwrap());
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    // Multi-byte characters span several byte tokens: some pushes were held back.
    assert!(pieces[..ids.len()].iter().any(String::is_empty));
}
