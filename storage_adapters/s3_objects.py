"""The S3 requests of an ``S3Store``: one object per key with its fencing metadata.

``S3Objects`` reads an object's ETag, token, mark and tombstone flag, writes it
with a conditional PUT (``If-Match``/``If-None-Match``), and turns S3 and network
errors into ours (``_errors``); ``storage_adapters/s3.py`` builds the store's
fencing, lifecycle and operations on it. The object layout is in that module's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from storage_adapters.base import FencedStore
from storage_adapters.errors import StorageUnavailable, StoreMisconfigured, StoreNotStarted

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

__all__ = ["LostRace", "ObjectInfo", "S3Objects", "error_status"]

_TOKEN: Final = "fencegate-token"
_MARK: Final = "fencegate-mark"
_DELETED: Final = "fencegate-deleted"
_LOST_RACE: Final = frozenset({409, 412})
_EMPTY_MD5: Final = "d41d8cd98f00b204e9800998ecf8427e"  # the ETag of an empty object


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What fencing needs to know about an object (and its body, for a GET)."""

    etag: str
    token: int | None
    mark: int
    deleted: bool
    content_type: str
    body: bytes = b""


class LostRace(Exception):
    """A conditional write found the object changed since it was read."""


class S3Objects(FencedStore):
    """Requests on the objects of one bucket; ``S3Store`` sets the fields below."""

    bucket: str
    endpoint: str | None
    prefix: str
    _timeout: float
    _client: S3Client | None

    # -- S3 requests -------------------------------------------------------------------

    async def _head(self, name: str) -> ObjectInfo | None:
        try:
            async with self._errors("HeadObject"):
                resp = await self._require_client().head_object(Bucket=self.bucket, Key=name)
        except _Missing:
            return None
        return self._object(name, resp)

    async def _fetch(self, name: str) -> ObjectInfo | None:
        try:
            async with self._errors("GetObject"):
                resp = await self._require_client().get_object(Bucket=self.bucket, Key=name)
                async with resp["Body"] as stream:
                    body = await stream.read()
        except _Missing:
            return None
        obj = self._object(name, resp)
        return ObjectInfo(obj.etag, obj.token, obj.mark, obj.deleted, obj.content_type, body)

    async def _write(
        self,
        name: str,
        current: ObjectInfo | None,
        body: bytes,
        content_type: str,
        *,
        token: int | None,
        mark: int,
        deleted: bool = False,
    ) -> None:
        """One conditional PUT: on the ETag read, or only if there is no object."""
        meta = {_MARK: str(mark)}
        if token is not None:
            meta[_TOKEN] = str(token)
        if deleted:
            meta[_DELETED] = "true"
        client = self._require_client()
        async with self._errors("PutObject", conditional=True):
            if current is None:
                resp = await client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=body,
                    ContentType=content_type,
                    Metadata=meta,
                    IfNoneMatch="*",
                )
            else:
                resp = await client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=body,
                    ContentType=content_type,
                    Metadata=meta,
                    IfMatch=current.etag,
                )
        if body and str(resp.get("ETag", "")).strip('"') == _EMPTY_MD5:
            # The server kept an empty object (moto's server parses a form-encoded body
            # as a form and drops it): never report that as a write of the body.
            raise StorageUnavailable(
                self.name,
                f"PutObject of {name!r}: the server stored an empty object instead of the"
                f" {len(body)}-byte body (ETag {_EMPTY_MD5}, the MD5 of nothing); a server that"
                f" drops {content_type!r} bodies needs another Content-Type",
            )

    async def _tombstone(self, name: str, current: ObjectInfo | None, *, mark: int) -> None:
        # The mark in the body too: every tombstone has its own ETag (an empty body would
        # give all of them one, and a writer holding it would pass If-Match after a newer one).
        body = f"deleted by fencegate; high-water mark {mark}\n".encode()
        await self._write(name, current, body, "text/plain", token=None, mark=mark, deleted=True)

    async def _delete_object(self, name: str, etag: str) -> None:
        # Servers without conditional DELETE ignore If-Match; only unfenced keys get here.
        async with self._errors("DeleteObject", conditional=True):
            await self._require_client().delete_object(Bucket=self.bucket, Key=name, IfMatch=etag)

    def _object(self, name: str, resp: Mapping[str, Any]) -> ObjectInfo:
        meta: Mapping[str, str] = resp.get("Metadata") or {}
        token = self._int_meta(name, meta, _TOKEN)
        mark = max(self._int_meta(name, meta, _MARK) or 0, token or 0)
        return ObjectInfo(
            etag=str(resp["ETag"]),
            token=token,
            mark=mark,
            deleted=meta.get(_DELETED) == "true",
            content_type=str(resp.get("ContentType") or "application/octet-stream"),
        )

    def _int_meta(self, name: str, meta: Mapping[str, str], field: str) -> int | None:
        raw = meta.get(field)
        if raw is None:
            return None
        if not (raw.isascii() and raw.isdigit()):  # fail closed: never guess a mark
            key = name.removeprefix(self.prefix)
            what = f"object {name!r} has metadata {field} = {raw!r}, not a token"
            raise self._corrupt(key, what)
        return int(raw)

    # -- client and errors -------------------------------------------------------------

    def _require_client(self) -> S3Client:
        if self._client is None:
            raise StoreNotStarted(self.name)
        return self._client

    @contextlib.asynccontextmanager
    async def _errors(
        self, op: str, *, conditional: bool = False, start: bool = False
    ) -> AsyncIterator[None]:
        """Bound one request by the timeout; S3 and network errors become ours.

        With ``start``, refused or missing credentials are ``StoreMisconfigured``
        (a retry will not help); later they are an outage (503), as a revoked key is.
        """
        try:
            async with asyncio.timeout(self._timeout):
                yield
        except NoCredentialsError:
            if not start:
                raise StorageUnavailable(self.name, f"{op}: no credentials") from None
            raise StoreMisconfigured(
                self.name,
                "no credentials: set access_key_id and secret_access_key, or"
                " AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ) from None
        except ClientError as exc:
            status = error_status(exc)
            if start and status in (401, 403):
                raise StoreMisconfigured(
                    self.name,
                    f"{op} on bucket {self.bucket!r} at {self.endpoint or 'AWS'} was refused"
                    f" ({status} {_code(exc)}): check access_key_id and secret_access_key"
                    " (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and the bucket's permissions",
                ) from None
            if conditional and (status in _LOST_RACE or _code(exc) == "NoSuchKey"):
                # 404: the object read was deleted meanwhile (outside fencegate)
                raise LostRace() from exc
            if status == 404 and op in ("HeadObject", "GetObject") and _code(exc) != "NoSuchBucket":
                raise _Missing() from exc
            raise StorageUnavailable(
                self.name, f"{op} answered {status} {_code(exc)}: {_message(exc)}"
            ) from exc
        except (BotoCoreError, aiohttp.ClientError, OSError) as exc:
            raise StorageUnavailable(
                self.name, f"{op} failed: {type(exc).__name__}: {exc}"
            ) from exc
        except TimeoutError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise StorageUnavailable(
                self.name, f"{op} took longer than {self._timeout:g} s"
            ) from exc


class _Missing(Exception):
    """HEAD or GET found no object."""


def error_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or "(no message)"
