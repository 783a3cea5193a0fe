//! Engine supervision on the real SmolLM2 model: when the engine thread fails (here a panic
//! injected through the debug-build hook), every running, queued and later request ends
//! with `Failed`, never as a finished reply, and the scheduler reports that it stopped.

use seedbar_engine::{ChatMessage, Model};
use seedbar_scheduler::{Event, Request, RequestStream, Scheduler, SchedulerConfig, SubmitError};

fn model() -> Model {
    Model::load(&seedbar_dev::default_model_path()).unwrap()
}

fn request(model: &Model, prompt: &str) -> Request {
    Request::new(
        model
            .chat_prompt(&[ChatMessage::new("user", prompt)], None)
            .unwrap(),
        64,
    )
}

/// The event that ends a stream (nothing may follow it).
fn last_event(stream: &mut RequestStream) -> Event {
    loop {
        let event = stream.blocking_next().expect("a stream ends with an event");
        if event.ends() {
            assert!(stream.blocking_next().is_none(), "nothing after the end");
            return event;
        }
    }
}

#[test]
fn a_failing_engine_fails_every_request_and_reports_it_stopped() {
    // Set before the engine thread's first step reads it.
    std::env::set_var("SEEDBAR_FAULT_INJECTION", "1");
    let model = model();
    let healthy = request(&model, "Tell me a long story about the sea.");
    let faulty = request(&model, "SEEDBAR-FAULT");
    let queued: Vec<Request> = (0..3).map(|_| healthy.clone()).collect();
    let scheduler = Scheduler::start(
        model,
        SchedulerConfig {
            max_rows: 2,
            ..SchedulerConfig::default()
        },
    );
    assert!(scheduler.is_running());
    let mut running = scheduler.submit(healthy).unwrap();
    // Let the healthy row stream before the fault arrives.
    assert!(matches!(running.blocking_next(), Some(Event::Token { .. })));
    let mut streams = vec![scheduler.submit(faulty).unwrap()];
    streams.extend(queued.into_iter().map(|r| scheduler.submit(r).unwrap()));
    streams.push(running);
    for stream in &mut streams {
        match last_event(stream) {
            Event::Failed(message) => assert!(message.contains("fault injected"), "{message}"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
    assert!(!scheduler.is_running());
    let after = Request::new(vec![1, 2, 3], 4);
    assert!(matches!(scheduler.submit(after), Err(SubmitError::Stopped)));
}
