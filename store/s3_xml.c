/* s3_xml.c: the XML answers of S3 (s3.h, tsr_s3_xml_*), read with libxml2. */
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "s3.h"

/* The text of child `name` of node, into out ("" when missing). */
static void xml_text(xmlNode *node, const char *name, char *out, size_t len) {
    out[0] = 0;
    for (xmlNode *n = node ? node->children : NULL; n; n = n->next)
        if (n->type == XML_ELEMENT_NODE && !strcmp((const char *)n->name, name)) {
            xmlChar *t = xmlNodeGetContent(n);
            snprintf(out, len, "%s", t ? (const char *)t : "");
            xmlFree(t);
            return;
        }
}

static xmlDoc *xml_read(const char *body, size_t n) {
    if (!n || n > INT_MAX) return NULL;
    return xmlReadMemory(body, (int)n, "s3.xml", NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
}

int tsr_s3_xml_error(const char *body, size_t n, char *code, size_t cl, char *msg, size_t ml) {
    code[0] = msg[0] = 0;
    xmlDoc *d = xml_read(body, n);
    if (!d) return 0;
    xmlNode *root = xmlDocGetRootElement(d);
    int is_err = root && !strcmp((const char *)root->name, "Error");
    if (is_err) {
        xml_text(root, "Code", code, cl);
        xml_text(root, "Message", msg, ml);
    }
    xmlFreeDoc(d);
    return is_err;
}

int tsr_s3_xml_list_objects(const char *body, size_t len, const char *where, char *token, size_t tlen,
                            tsr_s3_list_fn fn, void *user, tsr_error *err) {
    token[0] = 0;
    xmlDoc *d = xml_read(body, len);
    if (!d) return tsr_err(err, TSR_EIO, "%s: ListObjectsV2: the answer is not XML", where);
    int rc = 0;
    xmlNode *root = xmlDocGetRootElement(d);
    char trunc[16];
    xml_text(root, "IsTruncated", trunc, sizeof trunc);
    xml_text(root, "NextContinuationToken", token, tlen);
    if (strcmp(trunc, "true") != 0) token[0] = 0;
    for (xmlNode *n = root ? root->children : NULL; n && !rc; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        tsr_s3_object o;
        memset(&o, 0, sizeof o);
        char size[32];
        if (!strcmp((const char *)n->name, "Contents")) {
            xml_text(n, "Key", o.key, sizeof o.key);
            xml_text(n, "Size", size, sizeof size);
            xml_text(n, "ETag", o.etag, sizeof o.etag);
            o.size = strtoull(size, NULL, 10);
            rc = fn(user, &o, 0);
        } else if (!strcmp((const char *)n->name, "CommonPrefixes")) {
            xml_text(n, "Prefix", o.key, sizeof o.key);
            rc = fn(user, &o, 1);
        }
    }
    xmlFreeDoc(d);
    return rc;
}

void tsr_s3_xml_upload_id(const char *body, size_t n, char *upload_id, size_t idlen) {
    upload_id[0] = 0;
    xmlDoc *d = xml_read(body, n);
    if (d) xml_text(xmlDocGetRootElement(d), "UploadId", upload_id, idlen);
    xmlFreeDoc(d);
}

int tsr_s3_xml_complete_ok(const char *body, size_t n) {
    xmlDoc *d = xml_read(body, n);
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    /* AWS answers CompleteMultipartUploadResult; some servers ...Response */
    int ok = root && strncmp((const char *)root->name, "CompleteMultipartUpload", 23) == 0;
    xmlFreeDoc(d);
    return ok;
}

void tsr_s3_xml_newest_upload(const char *body, size_t n, const char *key, char *upload_id, size_t idlen) {
    upload_id[0] = 0;
    xmlDoc *d = xml_read(body, n);
    char best_time[64] = "";
    xmlNode *lroot = d ? xmlDocGetRootElement(d) : NULL;
    for (xmlNode *u = lroot ? lroot->children : NULL; u; u = u->next) {
        if (u->type != XML_ELEMENT_NODE || strcmp((const char *)u->name, "Upload") != 0) continue;
        char k[TSR_S3_MAX_KEY], id[512], init[64];
        xml_text(u, "Key", k, sizeof k);
        xml_text(u, "UploadId", id, sizeof id);
        xml_text(u, "Initiated", init, sizeof init);
        if (strcmp(k, key) != 0 || !id[0]) continue;
        if (!upload_id[0] || strcmp(init, best_time) > 0) {
            snprintf(upload_id, idlen, "%s", id);
            snprintf(best_time, sizeof best_time, "%s", init);
        }
    }
    xmlFreeDoc(d);
}

int tsr_s3_xml_list_parts(const char *body, size_t n, tsr_s3_part_fn fn, void *user, char *marker, size_t mlen) {
    xmlDoc *d = xml_read(body, n);
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    for (xmlNode *p = root ? root->children : NULL; p; p = p->next) {
        if (p->type != XML_ELEMENT_NODE || strcmp((const char *)p->name, "Part") != 0) continue;
        char num[16], size[32], etag[80], ck[64];
        xml_text(p, "PartNumber", num, sizeof num);
        xml_text(p, "Size", size, sizeof size);
        xml_text(p, "ETag", etag, sizeof etag);
        xml_text(p, "ChecksumSHA256", ck, sizeof ck);
        fn(user, strtoul(num, NULL, 10), strtoull(size, NULL, 10), etag, ck);
    }
    char trunc[16];
    xml_text(root, "IsTruncated", trunc, sizeof trunc);
    xml_text(root, "NextPartNumberMarker", marker, mlen);
    xmlFreeDoc(d);
    return strcmp(trunc, "true") == 0 && marker[0];
}
