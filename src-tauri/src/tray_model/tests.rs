use super::*;

const ENDPOINT: &str = "http://127.0.0.1:7337/v1";

fn serving() -> Phase {
    Phase::Serving {
        model: "SmolLM2-135M-Instruct".into(),
    }
}

/// `phase` with the server listening at ENDPOINT.
fn up(phase: Phase, paused: bool) -> TrayModel {
    TrayModel::new(phase, paused).listening_at(ENDPOINT)
}

fn item(model: &TrayModel, action: Action) -> (String, bool) {
    model
        .entries()
        .into_iter()
        .find_map(|e| match e {
            Entry::Item {
                action: a,
                label,
                enabled,
            } if a == action => Some((label, enabled)),
            _ => None,
        })
        .unwrap()
}

fn info(model: &TrayModel, id: &str) -> Option<String> {
    model.entries().into_iter().find_map(|e| match e {
        Entry::Info { id: i, text } if i == id => Some(text),
        _ => None,
    })
}

#[test]
fn status_line_for_each_phase() {
    let cases = [
        (Phase::Starting, "Starting…"),
        (
            Phase::Loading {
                model: Some("SmolLM2-135M-Instruct".into()),
            },
            "Loading SmolLM2-135M-Instruct…",
        ),
        (Phase::Loading { model: None }, "Loading the model…"),
        (
            Phase::Downloading {
                model: "SmolLM2".into(),
                percent: Some(42),
            },
            "Downloading SmolLM2 42%",
        ),
        (
            Phase::Downloading {
                model: "SmolLM2".into(),
                percent: None,
            },
            "Downloading SmolLM2…",
        ),
        (serving(), "Serving SmolLM2-135M-Instruct"),
        (
            Phase::NoModel {
                model: Some("SmolLM2-135M-Instruct".into()),
            },
            "SmolLM2-135M-Instruct is not installed",
        ),
        (Phase::NoModel { model: None }, "No model installed"),
        (
            Phase::Error {
                message: "Cannot download SmolLM2: offline".into(),
            },
            "Cannot download SmolLM2: offline",
        ),
        (Phase::Stopping, "Stopping…"),
    ];
    for (phase, line) in cases {
        let model = TrayModel::new(phase, false);
        assert_eq!(model.status_line(), line);
        assert_eq!(info(&model, STATUS_ID).as_deref(), Some(line));
    }
    assert_eq!(
        up(serving(), false).status_line(),
        "Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1"
    );
}

#[test]
fn pause_toggles_label_and_status() {
    let running = up(serving(), false);
    assert_eq!(
        item(&running, Action::TogglePause),
        ("Pause Server".into(), true)
    );
    assert_eq!(running.state_name(), "serving");
    assert_eq!(info(&running, HINT_ID), None);

    let paused = up(serving(), true);
    assert_eq!(
        item(&paused, Action::TogglePause),
        ("Resume Server".into(), true)
    );
    assert_eq!(paused.state_name(), "paused");
    assert!(paused
        .status_line()
        .starts_with("Paused: SmolLM2-135M-Instruct"));
    assert!(info(&paused, HINT_ID).unwrap().contains("503"));
    // The endpoint stays copyable while paused: the app still answers on it.
    assert_eq!(paused.endpoint(), Some(ENDPOINT));
    assert!(item(&paused, Action::CopyEndpoint).1);
}

#[test]
fn server_actions_while_it_listens_model_or_not() {
    for phase in [
        Phase::Starting,
        Phase::Loading { model: None },
        Phase::NoModel { model: None },
        Phase::Error {
            message: "boom".into(),
        },
    ] {
        let model = TrayModel::new(phase.clone(), false);
        assert!(!item(&model, Action::CopyEndpoint).1, "{model:?}");
        assert!(!item(&model, Action::TogglePause).1, "{model:?}");
        assert_eq!(model.endpoint(), None);
        // The server answers without a model: its endpoint is real and copyable.
        let listening = up(phase, false);
        assert!(item(&listening, Action::CopyEndpoint).1, "{listening:?}");
        assert_eq!(listening.endpoint(), Some(ENDPOINT));
    }
    let stopping = up(Phase::Stopping, false);
    assert!(!item(&stopping, Action::CopyEndpoint).1);
    assert_eq!(stopping.endpoint(), None);
}

#[test]
fn window_actions_work_until_quit() {
    let loading = TrayModel::new(Phase::Loading { model: None }, false);
    for action in [
        Action::OpenChat,
        Action::NewChat,
        Action::Settings,
        Action::Quit,
    ] {
        assert!(item(&loading, action).1);
    }
    let stopping = TrayModel::new(Phase::Stopping, false);
    for action in [
        Action::OpenChat,
        Action::NewChat,
        Action::Settings,
        Action::Quit,
    ] {
        assert!(!item(&stopping, action).1);
    }
}

#[test]
fn menu_shape() {
    let shape = |m: &TrayModel| {
        m.entries()
            .iter()
            .map(|e| match e {
                Entry::Separator => "-".to_string(),
                entry => entry.id(),
            })
            .collect::<Vec<_>>()
    };
    let base = shape(&TrayModel::default());
    assert_eq!(
        base,
        [
            "status",
            "-",
            "open-chat",
            "new-chat",
            "quick-chat",
            "-",
            "copy-endpoint",
            "toggle-pause",
            "-",
            "settings",
            "-",
            "quit"
        ]
    );
    assert_eq!(shape(&up(serving(), false)), base);
    assert_eq!(shape(&TrayModel::new(Phase::Stopping, false)), base);
    // A hint line comes right under the status when there is one.
    let mut with_hint = base.clone();
    with_hint.insert(1, "hint".to_string());
    assert_eq!(shape(&up(serving(), true)), with_hint);
    // Then what generates, then each download.
    let busy = TrayModel {
        activity: Activity {
            running: 2,
            tokens_per_second: Some(41.4),
            drafts_kept: None,
        },
        downloads: vec![
            Download {
                repo: "org/a".into(),
                percent: Some(42),
            },
            Download {
                repo: "org/b".into(),
                percent: None,
            },
        ],
        ..up(serving(), false)
    };
    let mut with_lines = base.clone();
    with_lines.splice(1..1, ["activity", "download", "download"].map(String::from));
    assert_eq!(shape(&busy), with_lines);
    let lines: Vec<_> = busy
        .entries()
        .into_iter()
        .filter_map(|e| match e {
            Entry::Info { id, text } if id != STATUS_ID => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(
        lines,
        [
            "2 chats · 41 tok/s",
            "Downloading org/a 42%",
            "Downloading org/b…"
        ]
    );
}

/// The models in memory, each with its size, and an unload item for each but the
/// default; none while the server does not answer.
#[test]
fn loaded_models_and_their_unload_items() {
    let model = |name: &str, bytes, default| LoadedModel {
        name: name.into(),
        bytes,
        default,
    };
    let two = TrayModel {
        loaded: vec![
            model("SmolLM2-135M-Instruct", 105_000_000, true),
            model("Qwen3-8B-4bit", 4_610_000_000, false),
        ],
        ..up(serving(), false)
    };
    let entries = two.entries();
    let at = entries
        .iter()
        .position(|e| e.id() == LOADED_ID)
        .expect("a loaded line");
    assert_eq!(entries[at - 1], Entry::Separator);
    let lines: Vec<_> = entries[at..at + 3]
        .iter()
        .map(|e| match e {
            Entry::Info { text, .. } => text.clone(),
            other => other.id(),
        })
        .collect();
    assert_eq!(
        lines,
        [
            "In memory: SmolLM2-135M-Instruct (default) · 105 MB",
            "In memory: Qwen3-8B-4bit · 4.6 GB",
            "unload:Qwen3-8B-4bit",
        ]
    );
    assert_eq!(
        entries[at + 2],
        Entry::Unload {
            model: "Qwen3-8B-4bit".into()
        }
    );
    assert_eq!(entries[at + 3], Entry::Separator);
    assert_eq!(
        pick_of(&entries[at + 2].id()),
        Some(Pick::Unload("Qwen3-8B-4bit"))
    );
    assert_eq!(pick_of("settings"), None);
    let stopping = TrayModel {
        phase: Phase::Stopping,
        ..two.clone()
    };
    assert!(stopping.entries().iter().all(|e| e.id() != LOADED_ID));
}

#[test]
fn live_status_in_tooltip_and_title() {
    let idle = up(serving(), false);
    assert_eq!(
        idle.tooltip(),
        "Seedbar: Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1"
    );
    assert_eq!(idle.title(), None);
    assert_eq!(idle.activity_line(), None);
    let one = TrayModel {
        activity: Activity {
            running: 1,
            tokens_per_second: Some(87.6),
            drafts_kept: None,
        },
        ..idle.clone()
    };
    assert_eq!(
        one.tooltip(),
        "Seedbar: SmolLM2-135M-Instruct · 1 chat · 88 tok/s"
    );
    assert_eq!(one.title().as_deref(), Some("88 tok/s"));
    // Before the first sample there is no speed yet.
    let starting = TrayModel {
        activity: Activity {
            running: 3,
            tokens_per_second: None,
            drafts_kept: None,
        },
        ..idle.clone()
    };
    assert_eq!(starting.activity_line().as_deref(), Some("3 chats"));
    assert_eq!(starting.title(), None);
    let drafting = TrayModel {
        activity: Activity {
            running: 1,
            tokens_per_second: Some(140.2),
            drafts_kept: Some(0.916),
        },
        ..idle
    };
    assert_eq!(
        drafting.activity_line().as_deref(),
        Some("1 chat · 140 tok/s · 92% of drafts kept")
    );
}

#[test]
fn missing_model_says_what_to_do() {
    let model = up(Phase::NoModel { model: None }, false);
    assert!(info(&model, HINT_ID).unwrap().contains("seedbar pull"));
    assert!(info(&model, HINT_ID).unwrap().contains("Import"));
    assert_eq!(model.state_name(), "no-model");
    let failed = up(
        Phase::Error {
            message: "Cannot download m: offline".into(),
        },
        false,
    );
    assert!(info(&failed, HINT_ID).unwrap().contains("seedbar pull"));
    assert_eq!(failed.state_name(), "error");
    // A server that did not start has nothing to import into.
    let down = TrayModel::new(
        Phase::Error {
            message: "x".into(),
        },
        false,
    );
    assert_eq!(info(&down, HINT_ID), None);
}

#[test]
fn long_errors_are_cut_to_one_line() {
    let message = format!("first line\nsecond {}", "x".repeat(200));
    let model = TrayModel::new(Phase::Error { message }, false);
    let line = model.status_line();
    assert_eq!(line.chars().count(), MAX_LINE_CHARS);
    assert!(line.starts_with("first line second x"));
    assert!(line.ends_with('…'));
    assert!(!line.contains('\n'));
}

#[test]
fn endpoints_are_never_cut() {
    let model = TrayModel::new(
        Phase::Serving {
            model: "HuggingFaceTB--SmolLM2-135M-Instruct".into(),
        },
        true,
    )
    .listening_at("http://127.0.0.1:65535/v1");
    assert!(model.status_line().ends_with("http://127.0.0.1:65535/v1"));
}

#[test]
fn quick_chat_shows_its_shortcut() {
    let mut model = up(serving(), false);
    assert_eq!(item(&model, Action::QuickChat), ("Quick Chat".into(), true));
    model.quick_chat_shortcut = Some("Ctrl+Shift+Space".into());
    assert_eq!(
        item(&model, Action::QuickChat),
        ("Quick Chat (Ctrl+Shift+Space)".into(), true)
    );
    model.phase = Phase::Stopping;
    assert!(!item(&model, Action::QuickChat).1);
}

#[test]
fn action_ids_round_trip() {
    for action in Action::ALL {
        assert_eq!(Action::from_id(action.id()), Some(action));
    }
    assert_eq!(Action::from_id(STATUS_ID), None);
    assert_eq!(Action::from_id("nope"), None);
}

#[test]
fn window_routes() {
    assert_eq!(route_of(Action::NewChat), Some("#/new"));
    assert_eq!(route_of(Action::Settings), Some("#/settings"));
    assert_eq!(route_of(Action::OpenChat), Some(""));
    assert_eq!(route_of(Action::Quit), None);
}

#[test]
fn recent_conversations_and_the_default_model_in_submenus() {
    let mut model = up(serving(), false);
    model.chat_models = vec!["SmolLM2-135M-Instruct".into(), "Qwen3-4B".into()];
    model.recent = vec![
        Recent {
            id: 7,
            title: "The long history of the Roman empire, told in a hundred short chapters".into(),
        },
        Recent {
            id: 3,
            title: "Capital of France".into(),
        },
    ];
    let choices: Vec<Choice> = model.entries().iter().filter_map(Entry::choice).collect();
    let labels: Vec<&str> = choices.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "Open Chat",
            "New Chat",
            "Quick Chat",
            "Recent Conversations",
            "Copy Endpoint URL",
            "Pause Server",
            "Default Model",
            "Settings…",
            "Quit Seedbar"
        ]
    );
    assert_eq!(
        choices[3].items,
        [
            "The long history of the Roman empire, t…",
            "Capital of France"
        ]
    );
    assert_eq!(choices[6].items, ["*SmolLM2-135M-Instruct", "Qwen3-4B"]);
    // Each item's id says what a click does.
    let submenu = |id: &str| {
        model
            .entries()
            .into_iter()
            .find_map(|e| match e {
                Entry::Submenu { id: i, entries, .. } if i == id => Some(entries),
                _ => None,
            })
            .unwrap()
    };
    let picks: Vec<String> = submenu(RECENT_MENU_ID)
        .iter()
        .chain(&submenu(DEFAULT_MENU_ID))
        .map(Entry::id)
        .collect();
    let picks: Vec<Pick> = picks.iter().map(|id| pick_of(id).unwrap()).collect();
    assert_eq!(
        picks,
        [
            Pick::Recent(7),
            Pick::Recent(3),
            Pick::Default("SmolLM2-135M-Instruct"),
            Pick::Default("Qwen3-4B")
        ]
    );
    assert_eq!(conversation_route(7), "#/c/7");
    assert_eq!(pick_of("unload:Qwen3-4B"), Some(Pick::Unload("Qwen3-4B")));
    assert_eq!(pick_of("recent:x"), None);
    // Loading another default: it is the one checked.
    model.phase = Phase::Loading {
        model: Some("Qwen3-4B".into()),
    };
    let checked = model
        .entries()
        .iter()
        .filter_map(Entry::choice)
        .find(|c| c.label == "Default Model");
    assert_eq!(
        checked.unwrap().items,
        ["SmolLM2-135M-Instruct", "*Qwen3-4B"]
    );
    // One chat model, served: no choice to make; nothing to reopen while stopping.
    model.phase = serving();
    model.chat_models.truncate(1);
    assert!(!model.entries().iter().any(|e| e.id() == DEFAULT_MENU_ID));
    model.phase = Phase::Stopping;
    assert!(!model.entries().iter().any(|e| e.id() == RECENT_MENU_ID));
}
