//! Running one step over many rows, apart from the models' math: how the rows' tokens form
//! matmul groups and attention calls (`plan`, chosen per backend for batch invariance),
//! where their keys and values live (`kv_cache`: each row's own cache and the GPU decode
//! pool), and CUDA's row kernel for dense products (`row_products`).

pub mod kv_cache;
pub mod plan;
pub mod row_products;
