//! A record table held in memory and written through to redb: reads never touch the disk.
//!
//! The map is the answer to every get and list; each change is committed to redb first and then
//! applied to the map, under one writer lock, so the map and the database never disagree on
//! the order of two changes to the same record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use redb::TableDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Store, StoreError};

/// Records of one redb table, by id, in memory.
pub struct RecordTable<T> {
    store: Store,
    table: TableDefinition<'static, &'static str, &'static [u8]>,
    rows: RwLock<HashMap<String, Arc<T>>>,
    writer: Mutex<()>,
}

impl<T: Serialize + DeserializeOwned> RecordTable<T> {
    /// Loads every record of `table`.
    pub fn load(
        store: Store,
        table: TableDefinition<'static, &'static str, &'static [u8]>,
        id_of: impl Fn(&T) -> &str,
    ) -> Result<Self, StoreError> {
        let rows = store
            .list_records::<T>(table)?
            .into_iter()
            .map(|r| (id_of(&r).to_string(), Arc::new(r)))
            .collect();
        Ok(Self {
            store,
            table,
            rows: RwLock::new(rows),
            writer: Mutex::new(()),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<T>>> {
        // A writer that panicked left the map as it was before or after its one insert.
        self.rows.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<T>>> {
        self.rows.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The record `id` (exact).
    pub fn get(&self, id: &str) -> Option<Arc<T>> {
        self.read().get(id).cloned()
    }

    /// The record `id`, or else the only one whose id starts with `id`.
    pub fn find(&self, id: &str) -> Option<Arc<T>> {
        let rows = self.read();
        if let Some(r) = rows.get(id) {
            return Some(r.clone());
        }
        let mut found = rows.iter().filter(|(k, _)| k.starts_with(id));
        match (found.next(), found.next()) {
            (Some((_, r)), None) => Some(r.clone()),
            _ => None,
        }
    }

    /// Every record (in no particular order).
    pub fn all(&self) -> Vec<Arc<T>> {
        self.read().values().cloned().collect()
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes (or replaces) the record `id`.
    pub fn put(&self, id: &str, record: T) -> Result<Arc<T>, StoreError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.store.put_record(self.table, id, &record)?;
        let record = Arc::new(record);
        self.write().insert(id.to_string(), record.clone());
        Ok(record)
    }

    /// Applies `change` to the record `id` and writes it, if the record exists (a concurrent
    /// removal is never undone). Returns the new record, or None when there was none or
    /// `change` declined (returned false).
    pub fn update(
        &self,
        id: &str,
        change: impl FnOnce(&mut T) -> bool,
    ) -> Result<Option<Arc<T>>, StoreError>
    where
        T: Clone,
    {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let Some(current) = self.get(id) else {
            return Ok(None);
        };
        let mut next = T::clone(&current);
        if !change(&mut next) {
            return Ok(None);
        }
        self.store.put_record(self.table, id, &next)?;
        let next = Arc::new(next);
        self.write().insert(id.to_string(), next.clone());
        Ok(Some(next))
    }

    /// Deletes the record `id`; absent is fine.
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.store.delete_record(self.table, id)?;
        self.write().remove(id);
        Ok(())
    }
}
