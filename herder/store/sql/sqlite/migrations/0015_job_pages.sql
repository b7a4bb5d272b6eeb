-- herder schema v15 (SQLite): the dashboard's jobs view (issue 16) pages by id, newest
-- first, filtered by status: (status, id) answers a page of one status from the index
-- without reading the other statuses' rows (the primary key serves the unfiltered view).
CREATE INDEX herder_jobs_status_id ON herder_jobs (status, id);
