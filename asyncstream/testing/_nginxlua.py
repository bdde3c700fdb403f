"""The Lua that :class:`~asyncstream.testing.Nginx` runs: the link (each connection's
rate, each response's first-byte delay), the bucket requests of its S3 profile, S3's 404s,
and the listing snapshot they read.

The link (:data:`LINK_LUA`, ``require("asyncstream_link").enter(rate, low, span)`` in
``access_by_lua_block``): the rate is the kernel's TCP pacing of the connection's socket
(``SO_MAX_PACING_RATE``, Linux 4.13 and later without the ``fq`` qdisc), set once per
connection, so every body on it, whatever its size, leaves at that rate, as the fault
proxy's token bucket paces a connection. nginx's own ``limit_rate`` was measured here at
60 to 75 MB/s for 90 MB/s (it sends 2 MiB, then waits), so it is the fallback only, for a
socket that cannot be found or paced. The socket is found by its ports among this
process's file descriptors (``getpeername``: nginx gives Lua no descriptor). Then the
delay: ``ngx.sleep`` of a uniform draw in ``[low, low + span]``, which holds no thread.

nginx serves objects as files by itself; what S3 asks of a bucket is this script's
(``content_by_lua_file``): ``HEAD /bucket`` (200, or 404 for a folder that is not there)
and ListObjectsV2 (``GET /bucket?list-type=2``: ``prefix``, ``delimiter``, ``max-keys``,
``start-after``, ``continuation-token``, ``encoding-type=url``), answered in S3's XML from
a snapshot of the served folder (:func:`write_listing`: one line per object, with the
size, date and ETag nginx itself sends for the file), read again at each listing. Other
bucket requests answer S3's ``501 NotImplemented``. A file that is not there answers 404
with S3's ``NoSuchKey`` (``NoSuchBucket`` where its first folder is not in the snapshot).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["LINK_LUA", "LISTING_LUA", "write_listing"]


def write_listing(root: Path, target: Path) -> int:
    """Write the listing snapshot of ``root`` (each folder in it a bucket, each file under
    one an object) to ``target``, atomically; returns the number of objects. Names with a
    tab or a line break are left out (the snapshot is tab-separated lines)."""
    lines = []
    for bucket in sorted(p for p in root.iterdir() if p.is_dir()):
        if "\t" in bucket.name or "\n" in bucket.name:
            continue
        lines.append(f"{bucket.name}\t\t\t\t")
        for path in sorted(bucket.rglob("*"), key=lambda p: p.relative_to(bucket).as_posix()):
            key = path.relative_to(bucket).as_posix()
            if not path.is_file() or "\t" in key or "\n" in key:
                continue
            st = path.stat()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(st.st_mtime))
            etag = f'"{int(st.st_mtime):x}-{st.st_size:x}"'  # nginx's own ETag
            lines.append(f"{bucket.name}\t{key}\t{st.st_size}\t{stamp}\t{etag}")
    scratch = target.with_name(target.name + ".new")
    scratch.write_text("".join(f"{line}\n" for line in lines))
    os.replace(scratch, target)
    return sum(1 for line in lines if not line.endswith("\t\t\t\t"))


LINK_LUA = r"""
-- The link of asyncstream.testing.Nginx (see _nginxlua.py).
local ffi = require "ffi"
ffi.cdef[[
int getpeername(int fd, void *addr, unsigned int *len);
int getsockname(int fd, void *addr, unsigned int *len);
int setsockopt(int fd, int level, int name, const void *value, unsigned int len);
]]
local C = ffi.C
local SOL_SOCKET, SO_MAX_PACING_RATE, EBADF = 1, 47, 9
local address = ffi.new("uint8_t[128]")
local length = ffi.new("unsigned int[1]")
local value = ffi.new("uint32_t[1]")
local paced, count = {}, 0  -- connection serial numbers already paced

local function port(fd, which)
  length[0] = 128
  if which(fd, address, length) ~= 0 then
    return nil, ffi.errno()
  end
  return address[2] * 256 + address[3]  -- sin_port and sin6_port, network order
end

local function pace(rate)
  local serial = ngx.var.connection
  if paced[serial] then
    return true
  end
  local remote, here = tonumber(ngx.var.remote_port), tonumber(ngx.var.server_port)
  local misses = 0
  for fd = 3, 1048575 do
    local peer, errno = port(fd, C.getpeername)
    if peer == remote and port(fd, C.getsockname) == here then
      value[0] = rate
      if C.setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, value, 4) ~= 0 then
        return false
      end
      if count >= 100000 then
        paced, count = {}, 0
      end
      paced[serial], count = true, count + 1
      return true
    end
    misses = errno == EBADF and misses + 1 or 0
    if misses > 256 then  -- past every descriptor in use
      return false
    end
  end
  return false
end

local M = {}

function M.enter(rate, low, span)
  if rate > 0 and not pace(rate) then
    ngx.var.limit_rate = rate
  end
  if low + span > 0 then
    ngx.sleep(low + math.random() * span)
  end
end

return M
"""


LISTING_LUA = r"""
-- The bucket requests of asyncstream.testing.Nginx (see _nginxlua.py).
local function xml(s)
  s = string.gsub(s, "&", "&amp;")
  s = string.gsub(s, "<", "&lt;")
  s = string.gsub(s, ">", "&gt;")
  s = string.gsub(s, '"', "&quot;")
  return s
end

local bucket, named = string.match(ngx.var.uri, "^/([^/]+)/?(.*)$")
local method = ngx.req.get_method()

local function fail(status, code, message)
  ngx.status = status
  if method == "HEAD" then
    return ngx.exit(status)
  end
  ngx.header["Content-Type"] = "application/xml"
  ngx.print('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>', code,
            '</Code><Message>', xml(message), '</Message><BucketName>',
            xml(bucket or ""), '</BucketName></Error>')
  return ngx.exit(ngx.OK)
end

local function objects()
  local file = io.open(ngx.var.s3_listing, "r")
  if not file then
    return nil
  end
  local found, keys = false, {}
  for line in file:lines() do
    local b, key, size, modified, etag =
      string.match(line, "^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$")
    if b == bucket then
      found = true
      if key ~= "" then
        keys[#keys + 1] = {key = key, size = size, modified = modified, etag = etag}
      end
    end
  end
  file:close()
  if found then
    return keys
  end
  return nil
end

local keys = bucket and objects()
if not keys then
  return fail(404, "NoSuchBucket", "The specified bucket does not exist")
end
if named ~= "" then  -- a GET or HEAD of a file that is not there (error_page)
  return fail(404, "NoSuchKey", "The specified key does not exist.")
end
if method == "HEAD" then
  ngx.status = 200
  return ngx.exit(200)
end
local args = ngx.req.get_uri_args()
local function arg(name)
  local value = args[name]
  if type(value) == "table" then
    value = value[1]
  end
  if type(value) ~= "string" then
    return nil
  end
  return value
end
if method ~= "GET" or arg("list-type") ~= "2" then
  return fail(501, "NotImplemented",
              "this server answers HEAD of a bucket and ListObjectsV2 (list-type=2) only")
end

local prefix = arg("prefix") or ""
local delimiter = arg("delimiter") or ""
local most = tonumber(arg("max-keys") or "1000") or 1000
most = math.max(0, math.min(1000, math.floor(most)))
local after = arg("start-after") or ""
local token = arg("continuation-token")
local marker = after
if token then
  local decoded = ngx.decode_base64(token)
  if not decoded then
    return fail(400, "InvalidArgument", "The continuation token provided is incorrect")
  end
  if decoded > marker then
    marker = decoded
  end
end
local url = arg("encoding-type") == "url"
local function name(s)
  if url then
    return ngx.escape_uri(s)
  end
  return xml(s)
end

local body, count, last, truncated, common = {}, 0, marker, false, nil
for _, object in ipairs(keys) do
  local key = object.key
  local skip = key <= marker or string.sub(key, 1, #prefix) ~= prefix
  if not skip and delimiter ~= "" and string.sub(marker, -#delimiter) == delimiter
      and string.sub(key, 1, #marker) == marker then
    skip = true  -- under the common prefix the last page ended on
  end
  if not skip then
    local rest = string.sub(key, #prefix + 1)
    local at = delimiter ~= "" and string.find(rest, delimiter, 1, true)
    local entry
    if at then
      entry = prefix .. string.sub(rest, 1, at + #delimiter - 1)
      if entry == common then
        entry = nil
      end
    end
    if at and not entry then
      -- already listed as a common prefix
    elseif count == most then
      truncated = true
      break
    elseif at then
      common = entry
      count = count + 1
      last = entry
      body[#body + 1] = "<CommonPrefixes><Prefix>" .. name(entry) .. "</Prefix></CommonPrefixes>"
    else
      count = count + 1
      last = key
      body[#body + 1] = "<Contents><Key>" .. name(key) .. "</Key><LastModified>"
        .. object.modified .. "</LastModified><ETag>" .. xml(object.etag)
        .. "</ETag><Size>" .. object.size .. "</Size><StorageClass>STANDARD</StorageClass>"
        .. "</Contents>"
    end
  end
end

ngx.header["Content-Type"] = "application/xml"
ngx.print('<?xml version="1.0" encoding="UTF-8"?>\n',
          '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
          "<Name>", xml(bucket), "</Name><Prefix>", name(prefix), "</Prefix>",
          "<KeyCount>", count, "</KeyCount><MaxKeys>", most, "</MaxKeys>")
if delimiter ~= "" then
  ngx.print("<Delimiter>", name(delimiter), "</Delimiter>")
end
if url then
  ngx.print("<EncodingType>url</EncodingType>")
end
if token then
  ngx.print("<ContinuationToken>", xml(token), "</ContinuationToken>")
end
if after ~= "" then
  ngx.print("<StartAfter>", name(after), "</StartAfter>")
end
ngx.print("<IsTruncated>", tostring(truncated), "</IsTruncated>")
if truncated then
  ngx.print("<NextContinuationToken>", ngx.encode_base64(last), "</NextContinuationToken>")
end
ngx.print(table.concat(body), "</ListBucketResult>")
"""
