"""A loopback HTTP server that answers like the Hugging Face Hub, for the dataset download and publish tests.

It serves what `huggingface_hub` asks of the Hub when it downloads a dataset file:

  GET  /api/datasets/<repo>/revision/<rev>      the commit a revision points to, the file list, the card
  HEAD /datasets/<repo>/resolve/<rev>/<file>    the file's commit (X-Repo-Commit), ETag and size
  GET  /datasets/<repo>/resolve/<rev>/<file>    the bytes, with Range for a resumed download

and when it uploads one (`HfApi.create_repo` and `create_commit`, the regular, non-LFS path):

  POST /api/repos/create                        a dataset repo with an initial commit (409 if it exists)
  POST /api/validate-yaml                       a README's YAML front matter: parsed, `configs` checked
  POST /api/datasets/<repo>/preupload/<rev>     each file's upload mode and the blob id the Hub has of it
  POST /api/datasets/<repo>/commit/<rev>        an NDJSON commit: files added (base64) and deleted

Writes need `Authorization: Bearer <token>` when `token` is set (401 otherwise).

with the Hub's error headers (X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound). Small
files get a git blob id as ETag, "LFS" files their sha256 (X-Linked-Etag, X-Linked-Size), as on the
Hub. Faults on request: a connection that breaks mid-file, corrupted bytes. Commits are added by
the test and branches move with them.

    with FakeHub() as hub:
        commit = hub.commit("org/data", {"test.jsonl": b"..."})
        os.environ["HF_ENDPOINT"] = hub.endpoint
"""

import base64
import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Commit:
    repo: str
    files: dict[str, bytes]
    lfs: set[str]
    card: dict | None


@dataclass
class Fault:
    """Break the connection after `after` bytes of the body, for the next `times` GETs of the file."""

    after: int
    times: int = 1


@dataclass
class FakeHub:
    host: str = "127.0.0.1"
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, dict[str, str]] = field(default_factory=dict)  # repo → branch/tag → commit
    breaks: dict[str, Fault] = field(default_factory=dict)  # file path → fault
    corrupt: set[str] = field(default_factory=set)  # file paths served with one byte changed
    gone: set[str] = field(default_factory=set)  # file paths listed but answered 404 (EntryNotFound)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    token: str | None = None  # the token writes must carry
    authorizations: list[str | None] = field(default_factory=list)  # the Authorization header of every write

    def commit(self, repo: str, files: dict[str, bytes], branch: str = "main", lfs=(), card=None, sha=None) -> str:
        """Add a commit with exactly `files` to `repo` (with id `sha`, else a made-up one) and point `branch`
        at it; return its id."""
        if sha is None:
            digest = hashlib.sha1(repo.encode() + str(len(self.commits)).encode(), usedforsecurity=False)
            for name in sorted(files):
                digest.update(name.encode() + b"\0" + files[name])
            sha = digest.hexdigest()
        self.commits[sha] = Commit(repo, dict(files), set(lfs), card)
        self.refs.setdefault(repo, {})[branch] = sha
        return sha

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer((self.host, 0), Handler)
        server.daemon_threads = True
        self._server: ThreadingHTTPServer | None = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (every response closed its connection, so none lingers). Idempotent."""
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def resolve(self, repo: str, revision: str) -> str | None:
        """The commit `revision` (a branch, tag or commit id of `repo`) names, or None."""
        if revision in self.refs.get(repo, {}):
            return self.refs[repo][revision]
        found = self.commits.get(revision)
        return revision if found is not None and found.repo == repo else None


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        self.hub.log.append((self.command, path, None))
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.hub.authorizations.append(self.headers.get("Authorization"))
        if self.hub.token is not None and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            return self._error(401, None, True)
        parts = [urllib.parse.unquote(p) for p in path.split("/")]
        if path == "/api/repos/create":
            return self._create(json.loads(data))
        if path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(data))
        # /api/datasets/<owner>/<name>/{preupload,commit}/<rev>
        if parts[1:3] == ["api", "datasets"] and len(parts) == 7 and parts[5] in ("preupload", "commit"):
            repo, revision = f"{parts[3]}/{parts[4]}", parts[6]
            sha = self._sha_or_404(repo, revision, True)
            if sha is None:
                return
            if parts[5] == "preupload":
                return self._preupload(sha, json.loads(data))
            return self._commit(repo, revision, sha, data)
        self._error(404, None, True)

    def _create(self, payload: dict) -> None:
        repo = f"{payload.get('organization')}/{payload.get('name')}"
        if payload.get("type") != "dataset":
            return self._error(400, None, True)
        if repo in self.hub.refs:
            return self._json(409, {"error": "You already created this dataset repo", "url": self._url(repo)})
        self.hub.commit(repo, {".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"})
        self._json(200, {"url": self._url(repo), "name": repo})

    def _url(self, repo: str) -> str:
        return f"{self.hub.endpoint}/datasets/{repo}"

    def _validate_yaml(self, payload: dict) -> None:
        """The Hub's check of a card's front matter, as far as the dataset viewer's configs go."""
        import yaml

        content = payload.get("content") or ""
        errors = []
        if content.startswith("---\n"):
            try:
                meta = yaml.safe_load(content[4:].split("\n---\n", 1)[0]) or {}
            except yaml.YAMLError as exc:
                meta, errors = {}, [{"message": f"invalid YAML: {exc}"}]
            for config in meta.get("configs") or []:
                files = config.get("data_files") if isinstance(config, dict) else None
                if not isinstance(config, dict) or not isinstance(config.get("config_name"), str) or not files:
                    errors.append({"message": f"a config needs config_name and data_files: {config!r}"})
                elif any(not isinstance(f, dict) or not f.get("path") or not f.get("split") for f in files):
                    errors.append({"message": f"data_files entries need split and path: {config!r}"})
        self._json(400 if errors else 200, {"errors": errors, "warnings": []})

    def _preupload(self, sha: str, payload: dict) -> None:
        have = self.hub.commits[sha].files
        answer = []
        for entry in payload.get("files", []):
            found = have.get(entry["path"])
            oid = git_blob_id(found) if found is not None else None
            answer.append({"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
        self._json(200, {"files": answer, "commitOid": sha})

    def _commit(self, repo: str, branch: str, sha: str, data: bytes) -> None:
        files = dict(self.hub.commits[sha].files)
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return self._json(400, {"error": "the first line must be the commit header"})
        parent = lines[0]["value"].get("parentCommit")
        if parent is not None and parent != sha:
            return self._json(412, {"error": "parentCommit is not the branch's head"})
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] in ("deletedFile", "deletedFolder"):
                prefix = value["path"].rstrip("/") + "/"
                gone = [
                    p for p in files if p == value["path"] or (line["key"] == "deletedFolder" and p.startswith(prefix))
                ]
                if not gone:
                    return self._json(404, {"error": "A file with this name doesn't exist"})
                for p in gone:
                    del files[p]
            else:
                return self._json(400, {"error": f"unsupported commit operation {line['key']}"})
        new = self.hub.commit(repo, files, branch=branch)
        self._json(200, {"commitOid": new, "commitUrl": f"{self._url(repo)}/commit/{new}", "pullRequestUrl": None})

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, {"Content-Type": "application/json"}, json.dumps(payload).encode(), True)

    def _serve(self, body: bool) -> None:
        path = urllib.parse.urlsplit(self.path).path
        self.hub.log.append((self.command, path, self.headers.get("Range")))
        parts = [urllib.parse.unquote(p) for p in path.split("/")]
        # /api/datasets/<owner>/<name>/revision/<rev>
        if parts[1:3] == ["api", "datasets"] and len(parts) == 7 and parts[5] == "revision":
            return self._info(f"{parts[3]}/{parts[4]}", parts[6], body)
        # /datasets/<owner>/<name>/resolve/<rev>/<file...>
        if parts[1:2] == ["datasets"] and len(parts) >= 7 and parts[4] == "resolve":
            return self._file(f"{parts[2]}/{parts[3]}", parts[5], "/".join(parts[6:]), body)
        self._error(404, None, body)

    def _sha_or_404(self, repo: str, revision: str, body: bool) -> str | None:
        """The commit that revision names in repo; None once a 404 has said which of the two the hub lacks."""
        if repo not in self.hub.refs:
            self._error(404, "RepoNotFound", body)
            return None
        sha = self.hub.resolve(repo, revision)
        if sha is None:
            self._error(404, "RevisionNotFound", body)
        return sha

    def _info(self, repo: str, revision: str, body: bool) -> None:
        sha = self._sha_or_404(repo, revision, body)
        if sha is None:
            return
        commit = self.hub.commits[sha]
        info: dict = {"id": repo, "sha": sha, "siblings": [{"rfilename": f} for f in sorted(commit.files)]}
        if commit.card is not None:
            info["cardData"] = commit.card
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

    def _file(self, repo: str, revision: str, name: str, body: bool) -> None:
        sha = self._sha_or_404(repo, revision, body)
        if sha is None:
            return
        commit = self.hub.commits[sha]
        if name not in commit.files or name in self.hub.gone:
            return self._error(404, "EntryNotFound", body, {"X-Repo-Commit": sha})
        data = commit.files[name]
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if name in commit.lfs:
            etag = hashlib.sha256(data).hexdigest()
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
        else:
            etag = git_blob_id(data)
        headers["ETag"] = f'"{etag}"'
        if body and name in self.hub.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and body:
            start = int(wanted[6:].split("-", 1)[0] or 0)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        rest = data[start:]
        fault = self.hub.breaks.get(name)
        if body and fault is not None and fault.times > 0:
            fault.times -= 1
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(rest))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(rest[: fault.after])
            self.wfile.flush()
            self.close_connection = True  # the rest never comes
            return
        self._send(status, headers, rest, body)

    def _error(self, status: int, code: str | None, body: bool, extra: dict | None = None) -> None:
        headers = {"Content-Type": "application/json", **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": code or "not found"}).encode(), body)

    def _send(self, status: int, headers: dict, payload: bytes, body: bool) -> None:
        self.close_connection = True  # one request per connection: stop() leaves no live connection behind
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(payload)), "Connection": "close"}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)
