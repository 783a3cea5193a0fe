//! Reranking over the store's cross-encoders (`seedbar_engine::reranker`): `POST /v1/rerank`,
//! also at `/rerank`, `/v1/reranking` and `/reranking` as llama-server serves it, in the shape
//! Jina's and Cohere's clients send: a query, documents (strings or `{"text"}` objects),
//! `top_n` and `return_documents`. Results come highest score first, each with its
//! document's index and `relevance_score` (the model's sigmoid, in (0, 1)), and the usage
//! counts the tokens of every query-document pair.

use std::sync::Arc;

use axum::{extract::State, Json};
use seedbar_engine::store::ModelKind;
use serde::{Deserialize, Serialize};

use crate::{error::ApiError, extract::ApiJson, App};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    model: String,
    query: String,
    documents: Vec<Document>,
    /// How many results to return, best first (all when absent).
    top_n: Option<usize>,
    /// Whether each result carries its document's text.
    #[serde(default)]
    return_documents: bool,
}

/// A document as clients send it.
#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn into_text(self) -> String {
        match self {
            Document::Text(text) | Document::Object { text } => text,
        }
    }
}

#[derive(Serialize)]
pub struct RerankResponse {
    id: String,
    model: String,
    results: Vec<RerankResult>,
    usage: RerankUsage,
}

#[derive(Serialize)]
struct RerankResult {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize)]
struct DocumentText {
    text: String,
}

#[derive(Serialize)]
struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

pub async fn rerank(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, ApiError> {
    if req.query.trim().is_empty() {
        return Err(ApiError::bad_param("query", "the query must not be empty"));
    }
    if req.documents.is_empty() {
        return Err(ApiError::bad_param(
            "documents",
            "documents must not be empty",
        ));
    }
    if req.top_n == Some(0) {
        return Err(ApiError::bad_param("top_n", "top_n must be at least 1"));
    }
    let reranker = app
        .encoders
        .get(&app.models, &req.model, ModelKind::Reranker)
        .await?;
    let documents: Vec<String> = req.documents.into_iter().map(Document::into_text).collect();
    let scored = reranker.rerank(req.query, documents.clone()).await?;
    let mut results: Vec<RerankResult> = scored
        .scores
        .iter()
        .enumerate()
        .map(|(index, &relevance_score)| RerankResult {
            index,
            relevance_score,
            document: req.return_documents.then(|| DocumentText {
                text: documents[index].clone(),
            }),
        })
        .collect();
    // Highest first; equal scores keep the documents' order.
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    results.truncate(req.top_n.unwrap_or(usize::MAX));
    Ok(Json(RerankResponse {
        id: format!("rerank-{:013x}", seedbar_scheduler::draw_seed()),
        model: reranker.name.clone(),
        results,
        usage: RerankUsage {
            prompt_tokens: scored.tokens,
            total_tokens: scored.tokens,
        },
    }))
}
